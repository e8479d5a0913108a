"""The cloud SeD: a SeD whose calls run on virtual machines it starts and stops.

To the tree it is one SeD (``server_type: cloud``): it registers with its
parent with the services of the VM image, answers discovery with an
estimation vector that includes the price of a call, the learnt boot time
and the VMs running and booting, and accepts calls. It runs none itself:

1. the pure :class:`~gridrpc.sed.cloud.policy.VMPool` decides which VM runs
   a call and when VMs are created and destroyed (policies ``per-call`` and
   ``pool``);
2. a VM boots with user data that starts a regular ``gridrpc sed``, whose
   parent is an agent ROUTER the cloud SeD binds for its VMs (a
   :class:`~gridrpc.local_agent.agent.Agent`); the VM is ready when that SeD
   registers, and lost when it misses its heartbeats;
3. the call is relayed to the VM's SeD unchanged (:mod:`.relay`) and the
   result relayed back.

Provider calls block, so they run in threads (``asyncio.to_thread``); the
SeD's loop never waits on the cloud API. Every VM is tagged
``gridrpc:owner=<name>``: on shutdown all of them are terminated, and a
restarted cloud SeD adopts (``orphans: adopt``, pool policy) or terminates
those it finds. See ``docs/cloud.md``.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from ...core import messages as m
from ...core.messages import MsgType
from ...errors import ConfigError
from ...local_agent.agent import Agent
from ...transport.channel import host_of
from ..server import SeD, _Call
from ..services import Service
from .config import CloudConfig, render_user_data, vm_command
from .policy import CreateVM, DestroyVM, Dispatch, FailCall, PoolConfig, VMPool
from .provider import (TERMINAL_STATES, CloudAuthError, CloudError, CloudProvider, UnknownImage,
                       VMSpec, make_provider)
from .relay import VMFailed, VMLink

log = logging.getLogger(__name__)

OWNER_TAG = "gridrpc:owner"
VM_TAG = "gridrpc:vm"
RUN_TAG = "gridrpc:run"


class _CallFailed(Exception):
    """The pool gave up on a call (FailCall)."""


class _VMAgent(Agent):
    """The agent the VMs' SeDs register with; tells its owner about them."""
    kind = "la"

    def __init__(self, owner: "CloudSeD", **kw) -> None:
        super().__init__(**kw)
        self.owner = owner

    def _subtree_changed(self) -> None:
        self.owner._vms_changed()

    def _child_lost(self, name: str) -> None:
        super()._child_lost(name)
        self.owner._vm_gone(name, "missed its heartbeats or left")


class CloudSeD(SeD):
    """A SeD running its calls on cloud VMs. ``provider`` defaults to
    ``make_provider(config.provider_config())`` (built in a thread at start)."""

    server_type = "cloud"
    ack_delay = 0.0         # acknowledge at once: clients learn the patience/relay state

    def __init__(self, name: str, parent: str | None = None, *, config: CloudConfig,
                 provider: CloudProvider | None = None, address: str = "tcp://127.0.0.1:0",
                 hb_interval: float = 1.0, hb_timeout: float = 3.0,
                 orphan_timeout: float | None = None, seed: int | None = None,
                 max_message_size: int | None = None, ack_timeout: float = 10.0) -> None:
        extra = {} if max_message_size is None else {"max_message_size": max_message_size}
        super().__init__(name, parent, address=address, max_concurrent=config.capacity,
                         queue="fcfs", replicas=1, isolation="inline", hb_interval=hb_interval,
                         hb_timeout=hb_timeout, orphan_timeout=orphan_timeout, seed=seed, **extra)
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
            billing_minimum=config.billing_minimum), name_prefix=f"{name}-{self.run_token}-")
        for r in self.replicas.values():
            r.predictor.default = config.runtime_guess
        for spec in config.services:
            self.add_image_service(spec)
        self.vm_agent: _VMAgent | None = None
        self.vm_parent: str | None = None        # the address written into the user data
        self._links: dict[str, VMLink] = {}       # ready VMs' SeDs
        self._dead: set[str] = set()              # VM names destroyed (ignore their SeDs)
        self._raw: dict[str, tuple[dict, list]] = {}
        self._waiters: dict[str, asyncio.Future] = {}
        self._creating: set[asyncio.Task] = set()
        self._bg: set[asyncio.Task] = set()
        self._destroyed_ids: set[str] = set()
        self._destroy_retry: dict[str, str] = {}  # vm id -> name, for failed terminations
        self._pool_timer: asyncio.TimerHandle | None = None
        self._cloud_closing = False
        self.events: list[tuple[float, str, str]] = []   # (time, what, vm name): for tests/dashboard

    # ------------------------------------------------------------------ services
    def add_image_service(self, spec: str) -> None:
        """Offer a service of the image (``[name=]module:function``). If the
        module is not importable here, the service is still offered, without
        argument checks: only the VMs run it."""
        name, _, target = spec.rpartition("=")
        name = name or target.rsplit(":", 1)[-1]
        try:
            self.add_service(name, target)
        except ConfigError as exc:
            log.info("cloud SeD %s: service %s is not importable here (%s); offered without "
                     "argument checks", self.name, spec, exc)
            self.services[name] = Service(name=name, fn=_runs_on_vms, doc=f"{target} (on cloud VMs)")
            self._fns[name] = _runs_on_vms

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "CloudSeD":
        c = self.config
        if self.provider is None:
            self.provider = await asyncio.to_thread(make_provider, c.provider_config())
        listen = c.vm_listen or f"tcp://{host_of(self.bind_address)}:0"
        self.vm_agent = _VMAgent(self, name=f"{self.name}.vms", address=listen,
                                 hb_interval=self.hb_interval, hb_timeout=self.hb_timeout)
        await self.vm_agent.start()
        self.vm_parent = c.vm_advertise or self.vm_agent.address
        try:
            await self._handle_orphans()
            await super().start()
        except BaseException:
            await self.vm_agent.aclose()
            raise
        self._apply_pool(self.policy.start(time.monotonic()))
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch_provider()))
        log.info("cloud SeD %s: policy %s, %d..%d VMs of %s (%s), VMs register at %s",
                 self.name, c.policy, c.min_vms, c.max_vms, c.image, c.instance_type, self.vm_parent)
        return self

    async def aclose(self) -> None:
        if self._closing or self._cloud_closing:
            return
        self._cloud_closing = True
        if self._pool_timer:
            self._pool_timer.cancel()
        for t in self._tasks:
            t.cancel()
        # calls waiting for (or running on) a VM fail over now, not after the clients' ping timeout
        for cid, fut in list(self._waiters.items()):
            if not fut.done():
                fut.set_exception(_CallFailed("the cloud SeD is shutting down"))
        for call in list(self.calls.values()):       # queued here, never started
            if call.state == "queued":
                self._finish_call(call, m.error_header(
                    call.id, "communication", f"cloud SeD {self.name} is shutting down",
                    type_="CloudVMFailure", **self._timing(call)))
        for link in list(self._links.values()):
            link.close("shut down with the cloud SeD")
        await asyncio.sleep(0)                  # let the calls answer their clients
        self._apply_pool(self.policy.shutdown())
        await self._drain_background()
        await self._sweep("shutdown")
        if self.vm_agent:
            await self.vm_agent.aclose()
        await super().aclose()

    async def _drain_background(self, timeout: float | None = None) -> None:
        """Wait for in-flight creates (each then destroys its VM) and destroys."""
        deadline = time.monotonic() + (timeout or 3 * self.config.timeout + 5)
        while self._creating or self._bg:
            tasks = list(self._creating | self._bg)
            left = deadline - time.monotonic()
            if left <= 0:
                log.error("cloud SeD %s: %d cloud requests still running at shutdown",
                          self.name, len(tasks))
                return
            await asyncio.wait(tasks, timeout=left)

    async def _sweep(self, why: str) -> None:
        """Terminate every instance tagged with our name (last line against leaks)."""
        try:
            vms = await asyncio.to_thread(self.provider.list, {OWNER_TAG: self.name})
        except CloudError as exc:
            log.error("cloud SeD %s: cannot list its VMs at %s (%s); VMs to check by hand: "
                      "tag %s=%s", self.name, why, exc, OWNER_TAG, self.name)
            return
        for vm in vms:
            if vm.state in ("terminated", "shutting-down"):
                continue
            try:
                await asyncio.to_thread(self.provider.destroy, vm.id)
                self._record("destroyed", vm.tags.get(VM_TAG, vm.id))
            except CloudError as exc:
                log.error("cloud SeD %s: VM %s NOT terminated at %s: %s", self.name, vm.id, why, exc)

    async def _handle_orphans(self) -> None:
        """VMs tagged with our name from a previous run: adopt or terminate."""
        vms = await asyncio.to_thread(self.provider.list, {OWNER_TAG: self.name})
        adopt = self.config.orphans == "adopt" and self.config.policy == "pool"
        now = time.monotonic()
        for vm in vms:
            if vm.state in TERMINAL_STATES:
                if vm.state in ("stopping", "stopped"):
                    await self._destroy_quietly(vm.id, vm.tags.get(VM_TAG, vm.id), "stopped orphan")
                continue
            name = vm.tags.get(VM_TAG) or vm.id
            if adopt and len(self.policy.vms) < self.config.max_vms:
                log.info("cloud SeD %s: adopting VM %s (%s) of a previous run", self.name, name, vm.id)
                self.policy.adopt(name, vm.id, now)
                self._record("adopted", name)
            else:
                log.info("cloud SeD %s: terminating VM %s (%s) of a previous run", self.name, name, vm.id)
                await self._destroy_quietly(vm.id, name, "orphan of a previous run")

    # ------------------------------------------------------------------ the pool's actions
    def _apply_pool(self, actions: list) -> None:
        for a in actions:
            if isinstance(a, Dispatch):
                fut = self._waiters.get(a.call_id)
                if fut is not None and not fut.done():
                    fut.set_result(a.vm)
            elif isinstance(a, FailCall):
                fut = self._waiters.get(a.call_id)
                if fut is not None and not fut.done():
                    fut.set_exception(_CallFailed(a.message))
            elif isinstance(a, CreateVM):
                self._record("create", a.name)
                t = asyncio.get_running_loop().create_task(self._create_vm(a.name))
                self._creating.add(t)
                t.add_done_callback(self._creating.discard)
            elif isinstance(a, DestroyVM):
                self._dead.add(a.name)
                link = self._links.pop(a.name, None)
                if link is not None:
                    link.close(f"destroyed ({a.reason})")
                if self.vm_agent is not None:
                    self.vm_agent.registry.remove(a.name)
                if a.vm_id is not None:
                    log.info("cloud SeD %s: terminating VM %s (%s): %s", self.name, a.name, a.vm_id, a.reason)
                    self._spawn(self._destroy_quietly(a.vm_id, a.name, a.reason))
        self._arm_pool_timer()

    def _spawn(self, coro) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    def _arm_pool_timer(self) -> None:
        if self._cloud_closing:
            return
        wake = self.policy.next_wakeup(time.monotonic())
        if self._pool_timer is not None:
            self._pool_timer.cancel()
            self._pool_timer = None
        if wake is not None:
            delay = max(0.0, wake - time.monotonic()) + 0.005
            self._pool_timer = asyncio.get_running_loop().call_later(delay, self._pool_tick)

    def _pool_tick(self) -> None:
        self._pool_timer = None
        if not self._cloud_closing:
            self._apply_pool(self.policy.tick(time.monotonic()))

    def _record(self, what: str, vm: str) -> None:
        self.events.append((time.time(), what, vm))
        if len(self.events) > 1000:
            del self.events[:100]

    async def _create_vm(self, name: str) -> None:
        c = self.config
        command = vm_command(vm_name=name, parent=self.vm_parent, services=c.services,
                             hb_interval=self.hb_interval, hb_timeout=self.hb_timeout,
                             orphan_timeout=c.vm_orphan_timeout, max_concurrent=c.vm_max_concurrent,
                             extra_args=c.vm_args)
        spec = VMSpec(image=c.image, instance_type=c.instance_type, key_name=c.key_name,
                      security_group=c.security_group, name=name, terminate_on_shutdown=True,
                      user_data=render_user_data(vm_name=name, owner=self.name, command=command,
                                                 python=c.python, setup=c.setup, teardown=c.teardown),
                      tags={**c.tags, OWNER_TAG: self.name, VM_TAG: name, RUN_TAG: self.run_token})
        try:
            vm = await asyncio.to_thread(self.provider.create, spec)
        except CloudError as exc:
            permanent = isinstance(exc, (UnknownImage, CloudAuthError))
            log.warning("cloud SeD %s: cannot create VM %s: %s", self.name, name, exc)
            self._record("create_failed", name)
            if not self._cloud_closing:
                self._apply_pool(self.policy.vm_create_failed(name, str(exc), time.monotonic(),
                                                              permanent=permanent))
            return
        log.info("cloud SeD %s: created VM %s (%s)", self.name, name, vm.id)
        self._record("created", name)
        self._apply_pool(self.policy.vm_created(name, vm.id, time.monotonic()))

    async def _destroy_quietly(self, vm_id: str, name: str, reason: str) -> None:
        try:
            await asyncio.to_thread(self.provider.destroy, vm_id)
        except CloudError as exc:
            log.error("cloud SeD %s: cannot terminate VM %s (%s): %s; will retry", self.name,
                      name, vm_id, exc)
            self._destroy_retry[vm_id] = name
            return
        self._destroy_retry.pop(vm_id, None)
        self._destroyed_ids.add(vm_id)
        self._record("destroyed", name)

    # ------------------------------------------------------------------ VMs' SeDs
    def _vms_changed(self) -> None:
        if self._cloud_closing or self.vm_agent is None:
            return
        now = time.monotonic()
        for name, child in list(self.vm_agent.registry.children.items()):
            address = child.info.get("address")
            link = self._links.get(name)
            if link is not None and link.address == address:
                continue
            if name in self._dead or name not in self.policy.vms or not address:
                continue        # a destroyed VM's SeD still talking, or a stranger
            if link is not None:                # same VM, new address: its SeD restarted
                self._links.pop(name).close("re-registered at a new address")
            self._links[name] = VMLink(name, address, ack_timeout=self.ack_timeout,
                                       ping_interval=self.hb_interval, ping_timeout=self.hb_timeout + 1.0)
            log.info("cloud SeD %s: VM %s ready (SeD at %s)", self.name, name, address)
            self._record("ready", name)
            self._apply_pool(self.policy.vm_registered(name, address, now))

    def _vm_gone(self, name: str, why: str) -> None:
        if self._cloud_closing:
            return
        link = self._links.pop(name, None)
        if link is not None:
            link.close(why)             # its relays raise VMFailed -> call_failed
        if name in self.policy.vms:
            log.warning("cloud SeD %s: VM %s %s", self.name, name, why)
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
                vms = await asyncio.to_thread(self.provider.list, {OWNER_TAG: self.name})
            except CloudError as exc:
                log.warning("cloud SeD %s: cannot list VMs: %s", self.name, exc)
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
    def _on_call(self, route: list, h: dict, buffers: list) -> None:
        cid = h["id"]
        fresh = cid not in self.calls and cid not in self.recent
        if fresh:
            self._raw[cid] = (h, buffers)
        super()._on_call(route, h, buffers)
        if fresh and cid not in self.calls:
            self._raw.pop(cid, None)    # refused (bad arguments, unknown service...)

    async def _execute(self, call: _Call) -> None:
        r = call.replica
        cid = call.id
        h, buffers = self._raw.get(cid) or ({}, [])
        forward = {k: v for k, v in h.items() if k not in ("id", "sed")}
        loop = asyncio.get_running_loop()
        self._waiters[cid] = loop.create_future()
        attempt = 0
        current: tuple[VMLink, str] | None = None      # the relay in progress, to cancel it
        try:
            if self._cloud_closing:
                raise _CallFailed("the cloud SeD is shutting down")
            self._apply_pool(self.policy.submit(cid, time.monotonic(),
                                                tcomp=r.predictor.predict(call.service.name)))
            while True:
                vm_name = await self._waiters[cid]
                self._waiters[cid] = loop.create_future()
                link = self._links.get(vm_name)
                attempt += 1
                rid = f"{cid}.{attempt}"
                try:
                    if link is None:
                        raise VMFailed(f"VM {vm_name} is gone")
                    current = (link, rid)
                    log.debug("cloud SeD %s: call %s -> VM %s", self.name, cid, vm_name)
                    mt, vh, frames = await link.run(rid, forward, buffers)
                    current = None
                except VMFailed as exc:
                    current = None
                    log.warning("cloud SeD %s: call %s: %s", self.name, cid, exc)
                    if self._cloud_closing:
                        raise _CallFailed(str(exc)) from None
                    self._apply_pool(self.policy.call_failed(cid, time.monotonic(), str(exc)))
                    continue
                self._finish_on_vm(call, vm_name, mt, vh, frames)
                return
        except _CallFailed as exc:
            if call.state == "killed":
                return
            r.failed += 1
            self._done(call, m.error_header(
                cid, "communication", f"cloud SeD {r.name} could not run the call: {exc}",
                type_="CloudVMFailure", **self._timing(call)))
        except asyncio.CancelledError:
            if current is not None:
                current[0].cancel(current[1])
            if not self._cloud_closing:
                self._apply_pool(self.policy.cancel(cid, time.monotonic()))
        finally:
            self._waiters.pop(cid, None)
            self._raw.pop(cid, None)

    def _finish_call(self, call: _Call, header: dict, buffers: list = ()) -> None:
        self._raw.pop(call.id, None)    # also for calls cancelled while queued (never executed)
        super()._finish_call(call, header, buffers)

    def _finish_on_vm(self, call: _Call, vm_name: str, mt: MsgType, vh: dict, frames: list) -> None:
        r = call.replica
        vm_timing = vh.get("timing") if isinstance(vh.get("timing"), dict) else {}
        if mt is MsgType.RESULT:
            started, ended = vm_timing.get("started"), vm_timing.get("ended")
            if isinstance(started, (int, float)) and isinstance(ended, (int, float)):
                r.predictor.observe(call.service.name, max(0.0, ended - started))
            r.completed += 1
        else:
            r.failed += 1
        self._apply_pool(self.policy.call_done(call.id, time.monotonic()))
        if call.state == "killed":
            return
        header = dict(vh, id=call.id, vm=vm_name, **self._timing(call))
        header["timing"]["vm"] = vm_timing
        self._done(call, header, frames)

    # ------------------------------------------------------------------ estimation
    def estimate(self, r, svc: Service, args_light: list) -> dict:
        now = time.time()
        sch = r.scheduler
        tcomp = r.predictor.predict(svc.name)
        ahead = [r.predictor.predict(q.service) for q in sch.waiting()]
        cloud = self.policy.estimate(time.monotonic(), tcomp, ahead=ahead)
        vec: dict[str, Any] = {
            "server_type": self.server_type, "tcomp": tcomp,
            "num_running": cloud["calls_on_vms"],
            "num_waiting": len(ahead) + cloud["calls_waiting_for_vm"],
            "max_concurrent": sch.max_concurrent,
            "time_since_last_solve": (now - r.last_solve) if r.last_solve is not None else 1e9,
            **cloud, "eft": now + cloud["est_wait"] + tcomp}
        if svc.estimate is not None:
            try:
                extra = svc.estimate(dict(vec), args_light)
                if isinstance(extra, dict):
                    vec.update(extra)
            except Exception:
                log.exception("estimation function of %s failed; standard tags only", svc.name)
        return vec

    def _load(self, r) -> dict:
        load = super()._load(r)
        load.update(self.policy.counts())
        load["server_type"] = self.server_type
        return load

    def statistics(self) -> dict:
        return {**super().statistics(), "cloud": self.policy.statistics(),
                "vm_parent": self.vm_parent}


def _runs_on_vms(*args, **kwargs):  # pragma: no cover - never called: calls go to VMs
    raise RuntimeError("this service runs on the cloud SeD's VMs only")
