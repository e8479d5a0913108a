"""The cloud back-end: a SeD's calls run on virtual machines it starts and stops.

1. the pure :class:`~gridrpc.sed.cloud.policy.VMPool` decides which VM runs
   a call and when VMs are created and destroyed (policies ``per-call`` and
   ``pool``);
2. a VM boots with user data that starts a regular ``gridrpc sed``, whose
   parent is an agent ROUTER this back-end binds for its VMs (a
   :class:`~gridrpc.runtime.agent.AgentRuntime`); the VM is ready when that SeD
   registers, and lost when it misses its heartbeats;
3. the call is relayed to the VM's SeD unchanged
   (:class:`~gridrpc.sed.backends.relay.RelayBackend`, as the pilot back-end
   relays to its pilots) and the answer relayed back.

Provider calls block, so they run in threads (``asyncio.to_thread``); the
loop never waits on the cloud API. Every VM is tagged
``gridrpc:owner=<SeD name>``: on shutdown all of them are terminated, and a
restarted cloud SeD adopts (``orphans: adopt``, pool policy) or terminates
those it finds. See ``docs/cloud.md``.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, ClassVar

from ...core.agent.machine import LocalRole
from ...core.events import EventKind, make_event
from ...runtime.agent import AgentRuntime
from ...transport.channel import host_of
from ..backends.relay import CallGivenUp, PolicyTimer, RelayBackend, RelayFailed, wake
from .config import CloudConfig, render_user_data, vm_command
from .policy import CreateVM, DestroyVM, Dispatch, FailCall, PoolConfig, VMPool
from .provider import (TERMINAL_STATES, CloudAuthError, CloudError, CloudProvider, UnknownImage,
                       VMSpec, make_provider)

log = logging.getLogger("gridrpc.sed.cloud.sed")

OWNER_TAG = "gridrpc:owner"
VM_TAG = "gridrpc:vm"
RUN_TAG = "gridrpc:run"


class _VMAgent(AgentRuntime):
    """The agent the VMs' SeDs register with; tells its owner about them."""

    def __init__(self, owner: "CloudVMs", **kw) -> None:
        super().__init__(role=LocalRole(), **kw)
        self.owner = owner

    def on_children_updated(self, reregister: bool) -> None:
        super().on_children_updated(reregister)
        self.owner._vms_changed()

    def on_child_lost(self, name: str, reason: str) -> None:
        super().on_child_lost(name, reason)
        self.owner._vm_gone(name, "missed its heartbeats or left")


class CloudVMs(RelayBackend):
    """Calls on cloud VMs (see the module doc). Trade-offs: capacity on
    demand, priced per call (``price`` tag); a VM's boot time (``per-call``:
    every call) or idle VMs kept (``pool``); the VMs must reach the SeD."""
    name: ClassVar[str] = "cloud"
    server_type = "cloud"
    # a VM's wait counts down while it boots and the pool changes with every call:
    # discoveries ask the cloud SeD (fan-out) rather than age a pushed snapshot
    push_estimation = False
    remote = True
    where = "on cloud VMs"
    relay_noun = "VM"
    detail_key = "vm"
    sed_what = "cloud SeD"
    failure_type = "CloudVMFailure"
    unavailable_type = "CloudUnavailable"

    def __init__(self, sed_name: str, config: CloudConfig, provider: CloudProvider | None = None, *,
                 ack_timeout: float = 10.0) -> None:
        super().__init__()
        self.sed_name = sed_name
        self.config = config
        self.provider = provider
        self.ack_timeout = ack_timeout
        self.run_token = os.urandom(2).hex()
        self.policy = VMPool(PoolConfig(
            policy=config.policy, min_vms=config.min_vms, max_vms=config.max_vms,
            vm_slots=config.vm_max_concurrent, idle_timeout=config.idle_timeout,
            boot_timeout=config.boot_timeout, grow_threshold=config.grow_threshold,
            retries=config.retries, boot_time=config.boot_time,
            price_per_hour=config.price_per_hour, billing_granularity=config.billing_granularity,
            billing_minimum=config.billing_minimum), name_prefix=f"{sed_name}-{self.run_token}-")
        self.vm_agent: _VMAgent | None = None
        self.vm_parent: str | None = None        # the address written into the user data
        self._dead: set[str] = set()              # VM names destroyed (ignore their SeDs)
        self._creating: set[asyncio.Task] = set()
        self._bg: set[asyncio.Task] = set()
        self._tasks: list[asyncio.Task] = []
        self._destroyed_ids: set[str] = set()
        self._destroy_retry: dict[str, str] = {}  # vm id -> name, for failed terminations
        self.timer = PolicyTimer(self.policy, self._apply_pool, time.monotonic)
        self.events: list[tuple[float, str, str]] = []   # (time, what, vm name): for tests/dashboard

    def bind(self, sed) -> None:
        super().bind(sed)
        for r in sed.replicas.values():
            r.predictor.default = self.config.runtime_guess

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        c, sed = self.config, self.sed
        if self.provider is None:
            self.provider = await asyncio.to_thread(make_provider, c.provider_config())
        listen = c.vm_listen or f"tcp://{host_of(sed.bind_address)}:0"
        self.vm_agent = _VMAgent(self, name=f"{self.sed_name}.vms", address=listen,
                                 hb_interval=sed.hb_interval, hb_timeout=sed.hb_timeout)
        await self.vm_agent.start()
        self.vm_parent = c.vm_advertise or self.vm_agent.address
        try:
            await self._handle_orphans()
        except BaseException:
            await self.vm_agent.aclose()
            raise
        self._apply_pool(self.policy.start(time.monotonic()))
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch_provider()))
        log.info("cloud SeD %s: policy %s, %d..%d VMs of %s (%s), VMs register at %s",
                 self.sed_name, c.policy, c.min_vms, c.max_vms, c.image, c.instance_type, self.vm_parent)

    async def close(self) -> None:
        self.closing = True
        self.timer.close()
        for t in self._tasks:
            t.cancel()
        await self.stop_relays()
        self._apply_pool(self.policy.shutdown())
        await self._drain_background()
        await self._sweep("shutdown")
        if self.vm_agent:
            await self.vm_agent.aclose()

    async def _drain_background(self, timeout: float | None = None) -> None:
        """Wait for in-flight creates (each then destroys its VM) and destroys."""
        deadline = time.monotonic() + (timeout or 3 * self.config.timeout + 5)
        while self._creating or self._bg:
            tasks = list(self._creating | self._bg)
            left = deadline - time.monotonic()
            if left <= 0:
                log.error("cloud SeD %s: %d cloud requests still running at shutdown", self.sed_name, len(tasks))
                return
            await asyncio.wait(tasks, timeout=left)

    async def _sweep(self, why: str) -> None:
        """Terminate every instance tagged with our name (last line against leaks)."""
        try:
            vms = await asyncio.to_thread(self.provider.list, {OWNER_TAG: self.sed_name})
        except CloudError as exc:
            log.error("cloud SeD %s: cannot list its VMs at %s (%s); VMs to check by hand: "
                      "tag %s=%s", self.sed_name, why, exc, OWNER_TAG, self.sed_name)
            return
        for vm in vms:
            if vm.state in ("terminated", "shutting-down"):
                continue
            try:
                await asyncio.to_thread(self.provider.destroy, vm.id)
                self._record("destroyed", vm.tags.get(VM_TAG, vm.id))
            except CloudError as exc:
                log.error("cloud SeD %s: VM %s NOT terminated at %s: %s", self.sed_name, vm.id, why, exc)

    async def _handle_orphans(self) -> None:
        """VMs tagged with our name from a previous run: adopt or terminate."""
        vms = await asyncio.to_thread(self.provider.list, {OWNER_TAG: self.sed_name})
        adopt = self.config.orphans == "adopt" and self.config.policy == "pool"
        now = time.monotonic()
        for vm in vms:
            if vm.state in TERMINAL_STATES:
                if vm.state in ("stopping", "stopped"):
                    await self._destroy_quietly(vm.id, vm.tags.get(VM_TAG, vm.id), "stopped orphan")
                continue
            name = vm.tags.get(VM_TAG) or vm.id
            if adopt and len(self.policy.vms) < self.config.max_vms:
                log.info("cloud SeD %s: adopting VM %s (%s) of a previous run", self.sed_name, name, vm.id)
                self.policy.adopt(name, vm.id, now)
                self._record("adopted", name)
            else:
                log.info("cloud SeD %s: terminating VM %s (%s) of a previous run", self.sed_name, name, vm.id)
                await self._destroy_quietly(vm.id, name, "orphan of a previous run")

    # ------------------------------------------------------------------ the pool's actions
    def _apply_pool(self, actions: list) -> None:
        for a in actions:
            if isinstance(a, Dispatch):
                wake(self.waiters, a.call_id, a.vm)
            elif isinstance(a, FailCall):
                wake(self.waiters, a.call_id, error=CallGivenUp(a.message, a.kind))
            elif isinstance(a, CreateVM):
                self._record("create", a.name)
                t = asyncio.get_running_loop().create_task(self._create_vm(a.name))
                self._creating.add(t)
                t.add_done_callback(self._creating.discard)
            elif isinstance(a, DestroyVM):
                self._dead.add(a.name)
                self.drop_link(a.name, f"destroyed ({a.reason})")
                if self.vm_agent is not None:
                    self.vm_agent.registry.remove(a.name)
                if a.vm_id is not None:
                    log.info("cloud SeD %s: terminating VM %s (%s): %s", self.sed_name, a.name, a.vm_id, a.reason)
                    self._spawn(self._destroy_quietly(a.vm_id, a.name, a.reason))
        self.timer.arm()

    def _spawn(self, coro) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    def _record(self, what: str, vm: str) -> None:
        now = time.time()
        self.events.append((now, what, vm))
        kind = {"ready": EventKind.VM_STARTED, "destroyed": EventKind.VM_STOPPED,
                "lost": EventKind.VM_STOPPED}.get(what)
        sed = getattr(self, "sed", None)
        if kind is not None and sed is not None:
            sed.outbox.emit(make_event(kind, now, self.sed_name, server=self.sed_name, detail=f"{what} {vm}"))
        if len(self.events) > 1000:
            del self.events[:100]

    async def _create_vm(self, name: str) -> None:
        c, sed = self.config, self.sed
        command = vm_command(vm_name=name, parent=self.vm_parent, services=c.services,
                             hb_interval=sed.hb_interval, hb_timeout=sed.hb_timeout,
                             orphan_timeout=c.vm_orphan_timeout, max_concurrent=c.vm_max_concurrent,
                             extra_args=c.vm_args)
        spec = VMSpec(image=c.image, instance_type=c.instance_type, key_name=c.key_name,
                      security_group=c.security_group, name=name, terminate_on_shutdown=True,
                      user_data=render_user_data(vm_name=name, owner=self.sed_name, command=command,
                                                 python=c.python, setup=c.setup, teardown=c.teardown),
                      tags={**c.tags, OWNER_TAG: self.sed_name, VM_TAG: name, RUN_TAG: self.run_token})
        try:
            vm = await asyncio.to_thread(self.provider.create, spec)
        except CloudError as exc:
            permanent = isinstance(exc, (UnknownImage, CloudAuthError))
            log.warning("cloud SeD %s: cannot create VM %s: %s", self.sed_name, name, exc)
            self._record("create_failed", name)
            if not self.closing:
                self._apply_pool(self.policy.vm_create_failed(name, str(exc), time.monotonic(),
                                                              permanent=permanent))
            return
        log.info("cloud SeD %s: created VM %s (%s)", self.sed_name, name, vm.id)
        self._record("created", name)
        self._apply_pool(self.policy.vm_created(name, vm.id, time.monotonic()))

    async def _destroy_quietly(self, vm_id: str, name: str, reason: str) -> None:
        try:
            await asyncio.to_thread(self.provider.destroy, vm_id)
        except CloudError as exc:
            log.error("cloud SeD %s: cannot terminate VM %s (%s): %s; will retry", self.sed_name,
                      name, vm_id, exc)
            self._destroy_retry[vm_id] = name
            return
        self._destroy_retry.pop(vm_id, None)
        self._destroyed_ids.add(vm_id)
        self._record("destroyed", name)

    # ------------------------------------------------------------------ VMs' SeDs
    def _vms_changed(self) -> None:
        if self.closing or self.vm_agent is None:
            return
        now = time.monotonic()

        def ours(name: str) -> bool:            # not a destroyed VM's SeD still talking, nor a stranger
            return name not in self._dead and name in self.policy.vms

        for name, address in self.link_registered(self.vm_agent.registry.children, ours):
            log.info("cloud SeD %s: VM %s ready (SeD at %s)", self.sed_name, name, address)
            self._record("ready", name)
            self._apply_pool(self.policy.vm_registered(name, address, now))

    def _vm_gone(self, name: str, why: str) -> None:
        if self.closing:
            return
        self.drop_link(name, why)       # its relays raise RelayFailed -> relay_failed
        if name in self.policy.vms:
            log.warning("cloud SeD %s: VM %s %s", self.sed_name, name, why)
            self._record("lost", name)
            self._apply_pool(self.policy.vm_lost(name, time.monotonic(), why))

    async def _watch_provider(self) -> None:
        """Compare the provider's list with the pool: VMs terminated behind our
        back are lost; tagged VMs nobody knows are terminated; failed
        terminations are retried."""
        missing: dict[str, int] = {}
        while True:
            await asyncio.sleep(self.config.poll_interval)
            listed_at = time.monotonic()
            try:
                vms = await asyncio.to_thread(self.provider.list, {OWNER_TAG: self.sed_name})
            except CloudError as exc:
                log.warning("cloud SeD %s: cannot list VMs: %s", self.sed_name, exc)
                continue
            alive = {vm.id for vm in vms if vm.state not in TERMINAL_STATES}
            for name, st in list(self.policy.vms.items()):
                # missing from two lists in a row, both asked after its creation (a list
                # may not show an instance launched a moment ago)
                if (st.id is None or st.state not in ("booting", "ready") or st.id in alive
                        or st.requested >= listed_at):
                    missing.pop(name, None)
                    continue
                missing[name] = missing.get(name, 0) + 1
                if missing[name] >= 2:
                    del missing[name]
                    self._vm_gone(name, "was terminated outside the cloud SeD")
            for vm in vms:
                name = vm.tags.get(VM_TAG, vm.id)
                if vm.state in ("terminated", "shutting-down") or vm.id in self._destroyed_ids:
                    continue
                if name not in self.policy.vms or name in self._dead:
                    self._destroy_retry.setdefault(vm.id, name)
            for vm_id, name in list(self._destroy_retry.items()):
                await self._destroy_quietly(vm_id, name, "retry / unknown VM")

    # ------------------------------------------------------------------ calls
    def relay_admit(self, call) -> None:
        self._apply_pool(self.policy.submit(call.id, time.monotonic(),
                                            tcomp=call.replica.predictor.predict(call.service),
                                            idempotent=call.svc.idempotent))

    def relay_failed(self, call_id: str, place: str, exc: RelayFailed) -> None:
        # the pool re-runs the call on a new VM within `retries`, unless it may have run (sent) and
        # is not idempotent: then FailCall of kind server_lost
        self._apply_pool(self.policy.call_failed(call_id, time.monotonic(), str(exc), sent=exc.sent))

    def relay_done(self, call_id: str) -> None:
        self._apply_pool(self.policy.call_done(call_id, time.monotonic()))

    def relay_cancelled(self, call_id: str) -> None:
        self._apply_pool(self.policy.cancel(call_id, time.monotonic()))

    # ------------------------------------------------------------------ estimation
    def estimate(self, replica, service, user, now: float) -> dict:
        sch = replica.scheduler
        tcomp = replica.predictor.predict(service.name)
        ahead = [replica.predictor.predict(q.service) for q in sch.waiting()]
        cloud = self.policy.estimate(time.monotonic(), tcomp, ahead=ahead)
        vec: dict[str, Any] = {
            "server_type": self.server_type, "tcomp": tcomp,
            "num_running": cloud["calls_on_vms"],
            "num_waiting": len(ahead) + cloud["calls_waiting_for_vm"],
            "max_concurrent": sch.max_concurrent,
            "time_since_last_solve": (now - replica.last_solve) if replica.last_solve is not None else 1e9,
            **cloud, "eft": now + cloud["est_wait"] + tcomp}
        return vec

    def load(self, replica) -> dict:
        return {**self.policy.counts(), "server_type": self.server_type}

    def statistics(self) -> dict:
        return {"cloud": self.policy.statistics(), "vm_parent": self.vm_parent}
