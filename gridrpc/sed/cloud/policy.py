"""The cloud SeD's VM policy, pure: which VM runs which call, when to start
and stop VMs, and the cloud part of the estimation vector.

No I/O, no clock: every method takes ``now`` and returns a list of actions
for the runtime (``gridrpc/sed/cloud/sed.py``) to carry out:

=================  ==========================================================
``CreateVM``       start an instance named ``name`` (report back with
                   :meth:`VMPool.vm_created` or :meth:`VMPool.vm_create_failed`)
``DestroyVM``      terminate it (``vm_id`` None: never created, nothing to do)
``Dispatch``       forward call ``call_id`` to VM ``vm`` (report back with
                   :meth:`VMPool.call_done` or :meth:`VMPool.call_failed`)
``FailCall``       give up on the call: the runtime answers the client with
                   the action's error ``kind``: ``communication`` (the client
                   fails over to its next candidate server), ``unavailable``
                   (no VM can be created at all; the call never ran: the
                   client tries its other candidates, then fails) or
                   ``server_lost`` (a non-idempotent call, see below)
=================  ==========================================================

Policies:

``per-call`` (DIET's "one VM per solve")
    every call gets a fresh VM, destroyed as soon as the call ends; at most
    ``max_vms`` at once, further calls wait for one to be destroyed. Simple,
    isolated, every call pays a boot.
``pool``
    between ``min_vms`` and ``max_vms`` VMs, each running up to
    ``vm_max_concurrent`` calls. Calls go to a ready VM with a free slot, the
    least loaded (then the longest idle). The pool *grows* when a waiting
    call's estimated wait (simulating the queue over the VMs' slots with the
    predicted run times) exceeds ``grow_threshold`` (default: the learnt boot
    time, i.e. "booting a VM would be faster"), and *shrinks*: a VM idle for
    ``idle_timeout`` is destroyed while more than ``min_vms`` remain.

Failures: a VM whose SeD has not registered ``boot_timeout`` after it was
requested is destroyed. A call charged for a failed VM (the VM booted for it
never came up, or died while running it) is retried on another VM up to
``retries`` times, then failed (``FailCall``). Each VM created is *claimed*
by the waiting call that caused it; the claim is what makes a boot failure
count against that call. Create errors back off (5 s doubling up to 60 s)
so a broken image does not create VMs in a tight loop.

Execution semantics: a call of a non-idempotent service (``submit(...,
idempotent=False)``) whose VM fails after the call was sent to it may have
run there; it is never retried, whatever ``retries`` says: it fails with
kind ``server_lost``. A VM failure *before* the call was sent (its VM never
booted, or was lost before the relay sent the call) is retried as for any
call. A permanent create failure (unknown image, bad credentials) fails the
call that caused it and, until the back-off delay has passed, every call
that has no VM on the way, at once (kind ``unavailable``); after the delay
one create is tried again (the image may have been registered meanwhile).
"""
from __future__ import annotations

import collections

from .placement import Placement
from .pool_model import (CreateVM, DestroyVM, Dispatch, FailCall,  # noqa: F401 - re-exported
                         PoolCall, PoolConfig, VMState)
from .provider_api import price_per_call

__all__ = ["PoolConfig", "VMPool", "CreateVM", "DestroyVM", "Dispatch", "FailCall", "VMState"]


class VMPool(Placement):
    """The state machine; see the module docstring. Where calls go and when
    the pool grows is :class:`~gridrpc.sed.cloud.placement.Placement`."""

    def __init__(self, config: PoolConfig, *, name_prefix: str = "vm-") -> None:
        self.config = config
        self.name_prefix = name_prefix
        self.vms: dict[str, VMState] = {}
        self.calls: dict[str, PoolCall] = {}
        self.pending: collections.deque[str] = collections.deque()   # call ids waiting for a VM
        self.boot_time = float(config.boot_time)
        self.boot_samples = 0
        self._seq = 0
        self._create_failures = 0
        self._no_create_before = 0.0
        self._broken: str | None = None        # the last permanent create failure, during its back-off
        self.stats = {"created": 0, "destroyed": 0, "boot_timeouts": 0, "create_failures": 0,
                      "vm_failures": 0, "calls_failed": 0, "dispatched": 0, "adopted": 0}

    # ------------------------------------------------------------------ inputs
    def start(self, now: float) -> list:
        """Start-up: the pool policy creates its ``min_vms``."""
        return self._schedule(now)

    def adopt(self, name: str, vm_id: str, now: float) -> list:
        """A VM of ours found at start-up (a previous run's). It counts as
        booting until its SeD registers, or is destroyed after boot_timeout."""
        if name in self.vms:
            return []
        self.vms[name] = VMState(name=name, requested=now, id=vm_id, state="booting", adopted=True)
        self.stats["adopted"] += 1
        return []

    def submit(self, call_id: str, now: float, *, tcomp: float = 0.0, idempotent: bool = True) -> list:
        """A call needs a VM; ``tcomp`` is its predicted run time;
        ``idempotent=False``: once sent to a VM, it is never run again."""
        if call_id in self.calls:
            return []
        self.calls[call_id] = PoolCall(id=call_id, tcomp=max(0.0, tcomp), submitted=now,
                                       idempotent=bool(idempotent))
        self.pending.append(call_id)
        return self._fail_while_broken(now) + self._schedule(now)

    def cancel(self, call_id: str, now: float) -> list:
        """The call was cancelled (the runtime cancels it on its VM, if any)."""
        c = self.calls.pop(call_id, None)
        if c is None:
            return []
        actions: list = []
        if call_id in self.pending:
            self.pending.remove(call_id)
        self._unclaim(call_id)
        if c.vm is not None and c.vm in self.vms:
            actions += self._release(self.vms[c.vm], call_id, now, "call cancelled")
        return actions + self._schedule(now)

    def vm_created(self, name: str, vm_id: str, now: float) -> list:
        self._create_failures = 0
        vm = self.vms.get(name)
        if vm is None:
            return [DestroyVM(name, vm_id, "no longer needed")]
        vm.id = vm_id
        if vm.state == "doomed":
            del self.vms[name]
            self.stats["destroyed"] += 1
            return [DestroyVM(name, vm_id, "no longer needed")]
        if vm.state == "creating":
            vm.state = "booting"
        return self._schedule(now)

    def vm_create_failed(self, name: str, message: str, now: float, *, permanent: bool = False) -> list:
        """The create request failed. ``permanent`` (bad image, credentials):
        the call it was started for fails at once instead of retrying."""
        vm = self.vms.pop(name, None)
        self.stats["create_failures"] += 1
        self._create_failures += 1
        delay = min(self.config.create_backoff * 2 ** (self._create_failures - 1),
                    self.config.create_backoff_max)
        self._no_create_before = now + delay
        actions: list = []
        if permanent:
            self._broken = f"cannot create a VM: {message}"
        if vm is not None and vm.claim is not None:
            actions += self._charge(vm.claim, f"cannot create a VM: {message}", now, fatal=permanent)
        return actions + self._fail_while_broken(now) + self._schedule(now)

    def vm_registered(self, name: str, address: str, now: float) -> list:
        """The VM's SeD registered: it is ready. Unknown names return [] (the
        runtime decides what to do with a stranger)."""
        vm = self.vms.get(name)
        if vm is None or vm.state == "doomed":
            return []
        vm.address = address
        if vm.state in ("creating", "booting"):
            vm.state = "ready"
            vm.ready_at = now
            vm.idle_since = now
            if not vm.adopted:
                sample = max(0.0, now - vm.requested)
                a = self.config.boot_alpha
                self.boot_time = sample if self.boot_samples == 0 else (1 - a) * self.boot_time + a * sample
                self.boot_samples += 1
        return self._schedule(now)

    def vm_lost(self, name: str, now: float, reason: str = "lost") -> list:
        """The VM or its SeD is gone (heartbeats, provider says terminated).
        Calls running there are reported by the runtime with :meth:`call_failed`."""
        vm = self.vms.get(name)
        if vm is None:
            return []
        actions = self._destroy(vm, reason)
        if vm.claim is not None and vm.claim in self.calls and self.calls[vm.claim].vm is None:
            actions += self._charge(vm.claim, f"VM {name} {reason} before it served the call", now)
        return actions + self._schedule(now)

    def call_done(self, call_id: str, now: float) -> list:
        """The call ended on its VM (result or error of the service itself)."""
        c = self.calls.pop(call_id, None)
        if c is None:
            return []
        if c.vm is not None and c.vm in self.vms:
            vm = self.vms[c.vm]
            vm.served += 1
            return self._release(vm, call_id, now, "call done") + self._schedule(now)
        return self._schedule(now)

    def call_failed(self, call_id: str, now: float, message: str, *, sent: bool = True) -> list:
        """The VM running the call failed (unreachable, died, lost the call):
        the VM is destroyed; the call is retried or failed. ``sent``: the
        call had been sent to the VM (False: the VM was gone before the relay
        sent it), so it may have run there: a non-idempotent call then fails
        with kind ``server_lost`` instead of being retried."""
        c = self.calls.get(call_id)
        if c is None:
            return []
        actions: list = []
        self.stats["vm_failures"] += 1
        vm_name = c.vm
        vm = self.vms.get(c.vm) if c.vm else None
        if vm is not None:
            vm.calls.discard(call_id)
            actions += self._destroy(vm, f"failed while running {call_id}")
        c.vm, c.dispatched_at = None, None
        if sent and vm_name is not None and not c.idempotent:
            self.calls.pop(call_id, None)
            self._unclaim(call_id)
            self.stats["calls_failed"] += 1
            return actions + [FailCall(call_id, (
                f"VM {vm_name} was lost while running call {call_id} ({message}); the service is not "
                "idempotent, so the call is not run again: it may or may not have completed"),
                kind="server_lost")] + self._schedule(now)
        return actions + self._charge(call_id, message, now, front=True) + self._schedule(now)

    def tick(self, now: float) -> list:
        """Boot timeouts, idle shrinking, retries after a create back-off."""
        actions: list = []
        for vm in list(self.vms.values()):
            if vm.state in ("creating", "booting") and now - vm.requested >= self.config.boot_timeout:
                self.stats["boot_timeouts"] += 1
                claim = vm.claim
                actions += self._destroy(vm, f"its SeD did not register within "
                                             f"{self.config.boot_timeout:g} s")
                if claim is not None and claim in self.calls and self.calls[claim].vm is None:
                    actions += self._charge(claim, f"VM {vm.name} did not boot within "
                                                   f"{self.config.boot_timeout:g} s", now)
        if self.config.policy == "pool":
            idle = sorted((vm for vm in self.vms.values() if vm.state == "ready" and not vm.calls
                           and now - vm.idle_since >= self.config.idle_timeout),
                          key=lambda v: v.idle_since)
            for vm in idle:
                if self._alive_count() <= self.config.min_vms:
                    break
                actions += self._destroy(vm, f"idle for {now - vm.idle_since:.0f} s")
        return actions + self._schedule(now)

    def shutdown(self) -> list:
        """Destroy everything (the runtime fails the calls itself)."""
        actions = [DestroyVM(vm.name, vm.id, "shutdown") for vm in self.vms.values()]
        self.stats["destroyed"] += len(self.vms)
        self.vms.clear()
        self.pending.clear()
        self.calls.clear()
        return actions

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`tick` has something to do (None: nothing planned)."""
        times = [vm.requested + self.config.boot_timeout for vm in self.vms.values()
                 if vm.state in ("creating", "booting")]
        if self.config.policy == "pool" and self._alive_count() > self.config.min_vms:
            times += [vm.idle_since + self.config.idle_timeout for vm in self.vms.values()
                      if vm.state == "ready" and not vm.calls]
        if self.pending and self._no_create_before > now:
            times.append(self._no_create_before)
        return min(times) if times else None

    # ------------------------------------------------------------------ queries
    def counts(self) -> dict:
        running = sum(1 for v in self.vms.values() if v.state == "ready")
        booting = sum(1 for v in self.vms.values() if v.state in ("creating", "booting"))
        return {"num_vms_running": running, "num_vms_booting": booting,
                "num_vms_busy": sum(1 for v in self.vms.values() if v.state == "ready" and v.calls),
                "calls_waiting_for_vm": len(self.pending),
                "calls_on_vms": sum(len(v.calls) for v in self.vms.values())}

    def vm_of(self, call_id: str) -> str | None:
        c = self.calls.get(call_id)
        return c.vm if c else None

    def calls_on(self, name: str) -> list[str]:
        vm = self.vms.get(name)
        return sorted(vm.calls) if vm else []

    def estimate(self, now: float, tcomp: float, *, ahead: list[float] = ()) -> dict:
        """Cloud tags for one more call of predicted run time ``tcomp``, after
        the calls already waiting and those in ``ahead`` (queued in the SeD,
        not yet handed to the pool): ``est_wait``, ``eft`` (boot time included
        when no VM is free), ``boot_time``, ``price`` (per call), VM counts."""
        queue = [self.calls[c].tcomp for c in self.pending if c in self.calls] + list(ahead)
        starts = self._simulate(now, queue + [tcomp])
        wait = min(max(0.0, starts[-1] - now), 1e9)      # no slot at all: "very long", not inf
        return {"est_wait": wait, "eft": now + wait + tcomp, "boot_time": self.boot_time,
                "price": self.price(tcomp), "price_per_hour": self.config.price_per_hour,
                "max_vms": self.config.max_vms, "policy": self.config.policy, **self.counts()}

    def price(self, tcomp: float) -> float:
        """What one call costs: per-call policy pays the boot and the
        provider's minimum billed time; a pool VM's time is shared by its
        ``vm_slots`` calls. Never 0 when the VM has a price (a call is billed
        at least one unit), so a cloud server never looks free."""
        c = self.config
        if c.price_per_hour <= 0:
            return 0.0
        if c.policy == "per-call":
            return price_per_call(max(self.boot_time + tcomp, 1e-9), c.price_per_hour, c.billing_granularity,
                                  minimum_s=c.billing_minimum)
        return price_per_call(max(tcomp, 1e-9), c.price_per_hour, c.billing_granularity) / c.vm_slots

    def statistics(self) -> dict:
        return {"boot_time": self.boot_time, "boot_samples": self.boot_samples, **self.stats,
                **self.counts(),
                "vms": [{"name": v.name, "id": v.id, "state": v.state, "calls": sorted(v.calls),
                         "served": v.served, "address": v.address, "adopted": v.adopted}
                        for v in self.vms.values()]}

    # ------------------------------------------------------------------ internals
    def _alive_count(self) -> int:
        return sum(1 for v in self.vms.values() if v.state != "doomed")

    def _new_name(self) -> str:
        while True:
            self._seq += 1
            name = f"{self.name_prefix}{self._seq}"
            if name not in self.vms:
                return name

    def _create(self, now: float, claim: str | None) -> list:
        name = self._new_name()
        self.vms[name] = VMState(name=name, requested=now, claim=claim)
        self.stats["created"] += 1
        return [CreateVM(name)]

    def _destroy(self, vm: VMState, reason: str) -> list:
        """Forget ``vm`` and terminate it; a VM still being created is kept as
        ``doomed`` until its id is known."""
        vm.claim = None
        if vm.id is None:
            vm.state = "doomed"
            return []
        self.vms.pop(vm.name, None)
        self.stats["destroyed"] += 1
        return [DestroyVM(vm.name, vm.id, reason)]

    def _unclaim(self, call_id: str) -> None:
        """No VM is on its way for ``call_id`` any more."""
        for vm in self.vms.values():
            if vm.claim == call_id:
                vm.claim = None

    def _release(self, vm: VMState, call_id: str, now: float, reason: str) -> list:
        vm.calls.discard(call_id)
        if self.config.policy == "per-call":
            return self._destroy(vm, reason)
        if not vm.calls:
            vm.idle_since = now
        return []

    def _charge(self, call_id: str, message: str, now: float, *, front: bool = False,
                fatal: bool = False) -> list:
        """A VM failure counts against ``call_id``: retry it, or fail it."""
        c = self.calls.get(call_id)
        if c is None:
            return []
        c.attempts += 1
        self._unclaim(call_id)
        if fatal or c.attempts > self.config.retries:
            self.calls.pop(call_id, None)
            if call_id in self.pending:
                self.pending.remove(call_id)
            self.stats["calls_failed"] += 1
            tries = "" if fatal else f" (after {c.attempts} VM failure{'s' if c.attempts > 1 else ''})"
            return [FailCall(call_id, message + tries, kind="unavailable" if fatal else "communication")]
        if call_id not in self.pending:
            if front:
                self.pending.appendleft(call_id)
            else:
                self.pending.append(call_id)
        return []

    def _fail_while_broken(self, now: float) -> list:
        """While a permanent create failure's back-off lasts, calls with no VM
        on the way fail at once (no create can succeed); afterwards one
        create is tried again."""
        if self._broken is None:
            return []
        if now >= self._no_create_before:
            self._broken = None
            return []
        if any(vm.state in ("creating", "booting", "ready") for vm in self.vms.values()):
            return []           # a VM exists (adopted, or created before): calls wait for it
        actions: list = []
        for cid in list(self.pending):
            self.pending.remove(cid)
            self.calls.pop(cid, None)
            self.stats["calls_failed"] += 1
            actions.append(FailCall(cid, self._broken, kind="unavailable"))
        return actions

    def _can_create(self, now: float) -> bool:
        return self._alive_count() < self.config.max_vms and now >= self._no_create_before
