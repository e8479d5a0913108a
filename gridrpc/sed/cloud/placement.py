"""Placement in the cloud SeD's VM pool: which VM serves which waiting call,
and when to start more VMs. The part of :class:`~gridrpc.sed.cloud.policy.VMPool`
where its two policies differ:

``per-call``
    a waiting call goes to a fresh VM (ready, never used); every waiting call
    without one claims a VM being created or booting, or creates one while
    below ``max_vms``; VMs booting for nobody are destroyed.
``pool``
    the head of the queue goes to the least loaded ready VM with a free slot
    (then the longest idle); ``min_vms`` are kept; the pool grows while a
    waiting call would wait longer than ``grow_threshold`` and a VM booted now
    would serve it sooner.

Both rest on :meth:`Placement._simulate`, the predicted start time of each
call of a queue over the VMs' slots; it also gives ``est_wait``.

:class:`Placement` is a mixin of :class:`~gridrpc.sed.cloud.policy.VMPool`:
it reads and changes the pool's state (``vms``, ``calls``, ``pending``,
``boot_time``) and uses its bookkeeping (``_create``, ``_destroy``,
``_unclaim``, ``_alive_count``, ``_can_create``). Pure, like the pool: no I/O, no clock.
"""
from __future__ import annotations

from .pool_model import Dispatch, VMState

__all__ = ["Placement"]


class Placement:
    """Scheduling methods of :class:`~gridrpc.sed.cloud.policy.VMPool`."""

    def _schedule(self, now: float) -> list:
        if self.config.policy == "per-call":
            return self._schedule_per_call(now)
        return self._schedule_pool(now)

    def _dispatch(self, call_id: str, vm: VMState, now: float) -> Dispatch:
        c = self.calls[call_id]
        self.pending.remove(call_id)
        c.vm, c.dispatched_at = vm.name, now
        vm.calls.add(call_id)
        self._unclaim(call_id)
        self.stats["dispatched"] += 1
        return Dispatch(call_id, vm.name)

    def _schedule_per_call(self, now: float) -> list:
        actions: list = []
        # fresh VMs only: ready, never used, not running anything
        for vm in self.vms.values():
            if not self.pending:
                break
            if vm.state == "ready" and not vm.calls and vm.served == 0:
                target = vm.claim if vm.claim in self.pending else self.pending[0]
                actions.append(self._dispatch(target, vm, now))
        # every waiting call without a VM on the way claims one (a free one, or a new one)
        claimed = {vm.claim for vm in self.vms.values() if vm.claim is not None}
        for cid in list(self.pending):
            if cid in claimed:
                continue
            free = next((vm for vm in self.vms.values()
                         if vm.state in ("creating", "booting") and vm.claim is None), None)
            if free is not None:
                free.claim = cid
            elif self._can_create(now):
                actions += self._create(now, cid)
            else:
                break
        # VMs booting for nobody (their call was cancelled or went elsewhere)
        if not self.pending:
            for vm in list(self.vms.values()):
                if vm.state in ("creating", "booting", "ready") and vm.claim is None and not vm.calls:
                    actions += self._destroy(vm, "its call no longer needs it")
        return actions

    def _schedule_pool(self, now: float) -> list:
        actions: list = []
        slots = self.config.vm_slots
        while self.pending:
            ready = [vm for vm in self.vms.values() if vm.state == "ready" and len(vm.calls) < slots]
            if not ready:
                break
            vm = min(ready, key=lambda v: (len(v.calls), v.idle_since, v.name))
            head = self.pending[0]
            actions.append(self._dispatch(head, vm, now))
        while self._alive_count() < self.config.min_vms and self._can_create(now):
            actions += self._create(now, None)
        # grow while a waiting call would wait longer than the threshold
        threshold = self.config.grow_threshold
        threshold = self.boot_time if threshold is None else threshold
        while self.pending and self._can_create(now):
            queue = [self.calls[c].tcomp for c in self.pending]
            starts = self._simulate(now, queue, with_room=False)
            # a call waits too long, and a VM booted now would serve it sooner
            late = next((i for i, s in enumerate(starts)
                         if s - now > threshold + 1e-9 and s > now + self.boot_time + 1e-9), None)
            if late is None:
                break
            claimed = {vm.claim for vm in self.vms.values()}
            claim = next((c for c in list(self.pending)[late:] if c not in claimed), None)
            actions += self._create(now, claim)
        return actions

    def _simulate(self, now: float, queue: list[float], *, with_room: bool = True) -> list[float]:
        """Predicted start time of each call in ``queue`` (in order), taking
        the earliest slot each time. Slots: free ones of ready VMs at ``now``,
        busy ones when their call is predicted to end, booting VMs' ones when
        the boot is predicted to end; ``with_room`` (below ``max_vms``): a new
        VM's slots at ``now + boot_time``. Per-call: a slot serves one call,
        and a VM whose call ends is replaced by a new boot. No slot at all:
        infinite waits."""
        c = self.config
        per_call = c.policy == "per-call"
        boot = self.boot_time
        free: list[float] = []
        for vm in self.vms.values():
            if vm.state == "doomed":
                continue
            if vm.state == "ready":
                ends = [max(now, self.calls[x].dispatched_at + self.calls[x].tcomp)
                        for x in vm.calls if x in self.calls and self.calls[x].dispatched_at is not None]
                if per_call:
                    free += [e + boot for e in ends] or ([now] if vm.served == 0 else [])
                else:
                    free += ends + [now] * max(0, c.vm_slots - len(ends))
            else:
                up = max(now, vm.requested + boot)
                free += [up] * (1 if per_call else c.vm_slots)
        room = max(0, c.max_vms - self._alive_count()) if with_room else 0
        if room:
            up = max(now + boot, self._no_create_before + boot)
            free += [up] * (room * (1 if per_call else c.vm_slots))
        if not free:
            return [float("inf")] * len(queue)
        free.sort()
        starts = []
        for t in queue:
            s = free.pop(0)
            starts.append(s)
            nxt = s + t + (boot if per_call else 0.0)
            # keep the list sorted (small lists: insertion is fine)
            i = 0
            while i < len(free) and free[i] <= nxt:
                i += 1
            free.insert(i, nxt)
        return starts
