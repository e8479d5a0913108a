"""The SeD (Server Daemon) runtime: routes and frames.

One process holds one or more *replicas* (``replicas=N``): each is its own
element of the tree (own name, own queue, own link to the parent) but they
share the process's endpoint (client socket), call records and execution
back-end, so hundreds of SeDs fit on two cores. Clients address a replica by
``sed`` name in the CALL header.

Per call: the :class:`~gridrpc.transport.endpoint.Endpoint` parses and
validates it; a repeated request id is answered from the one record of the
calls seen (:class:`~gridrpc.core.sed_calls.SedCalls`: re-acknowledged while
live, answered again once finished, told that its result is gone once the
byte-bounded cache dropped it; never run twice); a new call is decoded,
checked, queued in its replica's scheduler and acknowledged (ACCEPTED); the
execution back-end (:mod:`gridrpc.sed.backends`: worker processes, inline,
batch jobs, cloud VMs) runs it when the queue says Run and stops it when it
says Stop; the answer (RESULT or ERROR) is sent and kept for duplicates.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core import messages as m
from ..core.estimation import RunTimePredictor
from ..core.events import EventOutbox
from ..core.messages import MsgType
from ..transport.events_up import EventsUplink
from .access import OPEN, AccessRules
from ..transport.security import Security
from ..core.queue import SedScheduler, make_policy
from ..core.datastore import Where
from ..core.refs import refs_in_light
from ..core.sed_calls import DEFAULT_RESULT_CACHE_BYTES, SedCalls
from ..core.sed_protocol import discover_replicas, discover_reply
from ..core.view import PushRule, load_key, sed_entry
from ..errors import ConfigError
from ..runtime.lifecycle import Daemon
from ..transport.channel import host_of
from ..transport.endpoint import Endpoint
from ..transport.parent_link import ParentLink, parent_link
from .backends import ExecutionBackend, make_backend
from .calls.receive import CallsMixin, LiveCall
from .data.store import DataConfig, SedData
from .hostinfo import HostInfo
from .services import ORPHAN_POLICIES, Service, load_spec, make_service

__all__ = ["SeD", "Replica", "DEFAULT_MAX_MESSAGE"]

log = logging.getLogger(__name__)
DEFAULT_MAX_MESSAGE = 512 * 1024 * 1024
FRAME_MARGIN = 16 * 1024 * 1024


@dataclass
class Replica:
    name: str
    scheduler: SedScheduler
    predictor: RunTimePredictor = field(default_factory=RunTimePredictor)
    last_solve: float | None = None
    link: ParentLink | None = None
    completed: int = 0
    failed: int = 0
    timer: asyncio.TimerHandle | None = None
    push: PushRule = field(default_factory=PushRule)       # when its snapshot goes to the parent
    push_timer: asyncio.TimerHandle | None = None
    ahead: Any = None           # the queued call sent ahead to the worker (ExecutionBackend.send_ahead)


class SeD(CallsMixin, Daemon):
    """A server daemon offering services. See the README for the decorator API.

    ``isolation`` picks the execution back-end (``process``: worker
    processes, ``inline``); ``execution`` gives one instead (the batch and
    cloud SeDs). ``result_cache_bytes`` bounds the answers kept for repeated
    request ids."""

    def __init__(self, name: str, parent: str | None = None, *, address: str = "tcp://127.0.0.1:0",
                 max_concurrent: int = 1, queue: str = "fcfs", replicas: int = 1,
                 workers: int | None = None, isolation: str = "process", prestart_workers: int = 1,
                 hb_interval: float = 1.0, hb_timeout: float = 3.0,
                 max_message_size: int = DEFAULT_MAX_MESSAGE, orphan_timeout: float | None = None,
                 seed: int | None = None, queue_options: dict | None = None,
                 result_cache_bytes: int = DEFAULT_RESULT_CACHE_BYTES,
                 execution: ExecutionBackend | None = None, security: Security | None = None,
                 parent_key: bytes | list | None = None, orphan_call_timeout: float = 30.0,
                 data: "DataConfig | None" = None, access: AccessRules | None = None,
                 max_arg_bytes_per_user: int | None = None) -> None:
        if max_concurrent < 1:
            raise ConfigError("max_concurrent must be >= 1")
        if replicas < 1:
            raise ConfigError("replicas must be >= 1")
        if execution is None and isolation not in ("process", "inline"):
            raise ConfigError("isolation must be 'process' or 'inline'")
        if result_cache_bytes < 0:
            raise ConfigError("result_cache_bytes must be >= 0")
        if isinstance(prestart_workers, bool) or not isinstance(prestart_workers, int) or prestart_workers < 0:
            raise ConfigError("prestart_workers must be an integer >= 0")
        try:
            make_policy(queue, **(queue_options or {}))   # validate early: clear errors
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        super().__init__(name=name, address=address, parent=parent, orphan_timeout=orphan_timeout)
        self.max_concurrent = max_concurrent
        self.queue_name = queue
        self.queue_options = queue_options or {}
        self.hb_interval = hb_interval
        self.hb_timeout = hb_timeout
        self.max_message_size = max_message_size
        #: bytes of binary arguments one user may have in calls queued or running here (default: one
        #: message of the largest size): a few legal 400 MB calls took a SeD to 3.5 GB
        self.max_arg_bytes_per_user = max_message_size if max_arg_bytes_per_user is None else max_arg_bytes_per_user
        if self.max_arg_bytes_per_user < 1:
            raise ConfigError("max_arg_bytes_per_user must be >= 1")
        self.orphan_call_timeout = orphan_call_timeout    # a call's client silent this long: orphaned
        self.services: dict[str, Service] = {}
        self.functions: dict[str, Callable] = {}       # service -> callable (what the workers run)
        rng = random.Random(seed)
        width = len(str(replicas))
        names = [name] if replicas == 1 else [f"{name}-{i:0{width}d}" for i in range(1, replicas + 1)]
        self.replicas: dict[str, Replica] = {
            n: Replica(name=n, scheduler=SedScheduler(policy=make_policy(queue, **self.queue_options),
                                                      max_concurrent=max_concurrent,
                                                      rng=random.Random(rng.random())))
            for n in names}
        self.lifecycle = SedCalls({n: r.scheduler for n, r in self.replicas.items()},
                                  result_cache_bytes=result_cache_bytes)
        self.security = security
        self.parent_key = parent_key
        self._public_key = (security.pair.public.decode() if security is not None and security.enabled
                            else None)
        self.endpoint = Endpoint(name, address, {MsgType.CALL: self._on_call, MsgType.CANCEL: self._on_cancel,
                                                 MsgType.PING: self._on_ping}, what=f"SeD {name}",
                                 # frames a bit over the limit still arrive and get a clear
                                 # 'too_large' answer; far bigger ones are cut at the socket
                                 max_message_size=max_message_size + FRAME_MARGIN, security=security)
        self.endpoint.around_read = (self._read_begin, self._read_end)
        self.host = HostInfo()
        self._tasks: list[asyncio.Task] = []
        self._bg: set[asyncio.Task] = set()
        self.started = time.time()
        self.stats = {"calls": 0, "rejected": 0, "cancelled": 0, "preempted": 0, "orphans_killed": 0,
                      "orphans_finished": 0, "busy": 0}
        self.outbox = EventOutbox()     # lifecycle events, sent up the tree with the parent link
        self.access = access or OPEN    # who may call what, calls in flight per user (sed/access.py)
        self._in_flight: dict[str, int] = {}
        self._arg_bytes: dict[str, int] = {}       # user -> bytes of arguments of its calls queued or running
        self._by_owner: dict[object, int] = {}     # calls queued or running per client (its owner)
        self._acks: dict[int, list] = {}     # held ACCEPTEDs by slot of ACK_SLOT s (calls/receive.py)
        self._freed_by_cancel = False       # this read's cancels stopped running calls (calls/receive.py)
        self._paused_calls = 0              # calls admitted since the queues were paused (calls/receive.py)
        self._resume_timer: asyncio.TimerHandle | None = None   # queues resume after CANCEL_GRACE
        self.uplink: EventsUplink | None = None
        self.tmpdir = tempfile.mkdtemp(prefix="gridrpc-sed-")
        self.on_cleanup(shutil.rmtree, self.tmpdir, ignore_errors=True)
        self.on_cleanup(self.endpoint.close)
        self.on_cleanup(self.lifecycle.cache.drop_answers)   # nothing is answered any more: free them
        self.data = SedData(self, data)             # data held by reference (gridrpc.sed.data.store)
        self.on_cleanup(self.data.close)
        self.endpoint.handlers.update(self.data.handlers())
        if execution is None:
            size = workers or max(2, replicas * max_concurrent)
            opts = {"prestart": min(prestart_workers, size)} if isolation == "process" else {}
            execution = make_backend(isolation, workers=size, **opts)
        self.execution = execution
        self.isolation = self.execution.name
        self.execution.bind(self)

    @property
    def calls(self) -> dict[str, LiveCall]:
        """The live calls (queued, running) by request id."""
        return self.lifecycle.live

    @property
    def pool(self):
        """The worker pool of the ``process`` back-end (None for others)."""
        return getattr(self.execution, "pool", None)

    @property
    def router(self):
        """The client socket's channel (the endpoint's)."""
        return self.endpoint.channel

    @property
    def server_type(self) -> str:
        return self.execution.server_type

    # -- services -------------------------------------------------------
    def service(self, name: str | None = None, *, estimate: Callable | None = None, doc: str | None = None,
                aggregator: Any = None, estimate_uses_args: bool | None = None,
                idempotent: bool | None = None, on_orphan: str | None = None):
        """Decorator: ``@sed.service("add")``. ``estimate(vector, args)`` may
        return a dict of tags that add to or override the standard ones.
        ``aggregator`` (a name or ``{"name", "params"}``) ranks this service's
        servers when a request names none; agents honour it only if the name
        is registered on them (built-ins and the operator's plugins).
        ``estimate_uses_args=False``: ``estimate`` does not read the request's
        arguments, so the service's estimation is pushed and discoveries are
        answered from the agents' view (a service with its own ``estimate``
        is taken as request-dependent otherwise: always a fan-out).
        ``idempotent=False``: a call whose server died after it started is
        not run again (the client gets :class:`gridrpc.ServerLost`).
        ``on_orphan``: ``kill`` | ``finish`` | ``auto`` (default: kill
        idempotent calls, let the others finish and keep the result) for a
        call whose client stopped pinging for ``orphan_call_timeout``."""
        if callable(name):  # used as @sed.service without parentheses
            fn, name = name, None
            self.add_service(fn.__name__, fn)
            return fn

        def deco(fn):
            self.add_service(name or fn.__name__, fn, estimate=estimate, doc=doc, aggregator=aggregator,
                             estimate_uses_args=estimate_uses_args, idempotent=idempotent, on_orphan=on_orphan)
            return fn
        return deco

    def add_service(self, name: str, fn: Callable | str, *, estimate: Callable | None = None,
                    doc: str | None = None, aggregator: Any = None,
                    estimate_uses_args: bool | None = None, idempotent: bool | None = None,
                    on_orphan: str | None = None) -> None:
        """``fn`` is a callable or ``"module:function"``. On a back-end running
        calls elsewhere (batch jobs, VMs) a ``module:function`` that cannot be
        imported here is still offered, without argument checks."""
        ex = self.execution
        if isinstance(fn, str) and ex.remote:
            fn = fn.split("=", 1)[-1]
        ex.check_service(name, fn)
        try:
            if isinstance(fn, str):
                svc = load_spec(f"{name}={fn}")
                if aggregator is not None:
                    svc.aggregator = aggregator
            else:
                svc = make_service(name, fn, doc=doc, estimate=estimate, aggregator=aggregator)
        except ConfigError as exc:
            if not (ex.remote and isinstance(fn, str) and ":" in fn):
                raise
            log.info("SeD %s: %s is not importable here (%s); offered without argument checks, it runs %s",
                     self.name, fn, exc, ex.where)
            svc = Service(name=name, fn=_runs_elsewhere, doc=doc or f"{fn} ({ex.where})", estimate=estimate,
                          aggregator=aggregator)
        if estimate_uses_args is not None:
            svc.estimate_uses_args = estimate_uses_args
        if idempotent is not None:
            svc.idempotent = bool(idempotent)
        if on_orphan is not None:
            if on_orphan not in ORPHAN_POLICIES:
                raise ConfigError(f"on_orphan must be one of {', '.join(ORPHAN_POLICIES)}, not {on_orphan!r}")
            svc.on_orphan = on_orphan
        self.services[svc.name] = svc
        self.functions[svc.name] = svc.fn
        ex.services_changed(svc.name, fn)
        self._announce()

    def remove_service(self, name: str) -> None:
        if self.services.pop(name, None) is not None:
            self.functions.pop(name, None)
            self.execution.services_changed(name, None)
            self._announce()

    def _announce(self) -> None:
        for r in self.replicas.values():
            if r.link:
                r.link.update()

    # -- lifecycle (gridrpc.runtime.lifecycle) -----------------------------
    label = "SeD"

    async def setup(self) -> None:
        await self.execution.start()            # closed by drain(), first of all
        self.endpoint.start()
        self.address = self.endpoint.address
        self.on_cleanup(self._stop_replicas)
        if self.parent:
            for r in self.replicas.values():
                r.link = parent_link(
                    name=r.name, parent=self.parent,
                    register_info=lambda r=r: self._register_info(r),
                    heartbeat_info=lambda r=r: {"load": self._load(r)},
                    on_message=lambda mt, h, frames, r=r: self._on_parent(r, mt, h, frames),
                    hb_interval=self.hb_interval, hb_timeout=self.hb_timeout,
                    orphan_timeout=self.orphan_timeout, on_orphaned=self.orphaned,
                    security=self.security, parent_key=self.parent_key,
                    on_view_missing=lambda names, r=r: self._view_asked(r, names))
                r.link.start()
            first = next(iter(self.replicas.values()))     # the process's events go up one link
            self.uplink = EventsUplink(first.name, self.outbox, first.link.send)
            self.on_cleanup(self._close_uplink)
            self.uplink.start()
        self.on_cleanup(self._cancel_tasks)
        self._tasks.append(asyncio.get_running_loop().create_task(self._housekeeping()))
        log.info("SeD %s listening on %s with %d replica(s) (%s), services: %s", self.name, self.address,
                 len(self.replicas), self.execution.name, ", ".join(sorted(self.services)) or "(none)")

    async def drain(self) -> None:
        """The back-end ends its calls while the socket is still open: it may
        still answer them."""
        await self.execution.close()

    def _cancel_tasks(self) -> None:
        for t in [*self._tasks, *self._bg]:
            t.cancel()
        for c in list(self.calls.values()):
            if c.task:
                c.task.cancel()
        self._acks.clear()              # held ACCEPTEDs: nothing more is acknowledged

    async def _close_uplink(self) -> None:
        self.uplink.flush()             # the last events (a call cancelled at shutdown...)
        await self.uplink.aclose()

    async def _stop_replicas(self) -> None:
        for r in self.replicas.values():
            if r.timer:
                r.timer.cancel()
            if r.push_timer:
                r.push_timer.cancel()
            if r.link:
                await r.link.aclose()

    def may_leave(self) -> bool:
        """Orphaned: leave only once nothing runs."""
        return not any(r.scheduler.running for r in self.replicas.values())

    def orphan_detail(self) -> str:
        return " and nothing running"

    def describe_title(self) -> str:
        title = super().describe_title()
        if len(self.replicas) > 1:
            names = list(self.replicas)
            title += f" ({len(names)} replicas {names[0]}..{names[-1]})"
        return title

    def describe_offer(self) -> str:
        names = sorted(self.services)
        shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        return f" {shown or 'no service'}"

    # -- tree -----------------------------------------------------------
    # -- pushed state (discovery from the view, gridrpc.core.view) --------------
    def _view_changed(self, r: Replica) -> None:
        """The replica's queue changed: push its snapshot soon (coalesced)."""
        if r.link is None or self.closing:
            return
        key = load_key(r.scheduler)
        at = r.push.changed(key, key[0], time.monotonic())
        if at is not None:
            if r.push_timer is not None:
                r.push_timer.cancel()
            r.push_timer = asyncio.get_running_loop().call_later(max(0.0, at - time.monotonic()),
                                                                 self._push_view, r, False)

    def _push_view(self, r: Replica, force: bool = True) -> None:
        """Send the replica's snapshot: the estimation of every service whose
        estimation does not depend on the request (the parent's view).
        Not ``force``d (a coalesced change): nothing if the load came back
        to what was pushed last (a call shorter than the coalescing delay)."""
        r.push_timer = None
        if r.link is None or self.closing or not getattr(self.execution, "push_estimation", False):
            return
        if not r.push.take(load_key(r.scheduler), force):
            return
        entry = sed_entry(r.name, {s.name: self.estimate(r, s, []) for s in self.services.values() if s.pushed})
        if entry is None:
            return
        r.link.send(m.make(MsgType.VIEW, f"{r.name}:v{r.completed}", name=r.name, entries=[entry]))

    def _view_asked(self, r: Replica, names: list) -> None:
        """The parent lacks this replica's snapshot (lost on the way; an idle
        replica pushes only on change): push it now."""
        if r.name in names:
            if r.push_timer is not None:        # a coalesced push would send nothing if the load came back
                r.push_timer.cancel()
            self._push_view(r, force=True)

    def _register_info(self, r: Replica) -> dict:
        if r.link is not None and not self.closing:       # after the REGISTER: the parent knows us then
            asyncio.get_running_loop().call_soon(self._push_view, r)
        info = {"kind": "sed", "address": self.address, "host": host_of(self.address) or socket.gethostname(),
                "pid": os.getpid(), "started": self.started,
                "services": [s.describe() for s in self.services.values()], "load": self._load(r)}
        if self._public_key:
            info["public_key"] = self._public_key
        return info

    def _load(self, r: Replica) -> dict:
        load = {"policy": r.scheduler.policy.name, "num_running": len(r.scheduler.running),
                "num_waiting": len(r.scheduler.requests) - len(r.scheduler.running),
                "free_cpu": self.host.tags.get("free_cpu"), "completed": r.completed}
        load.update(self.execution.load(r))
        load["data_bytes"] = self.data.store.used[Where.MEMORY] + self.data.store.used[Where.DISK]
        return load

    def _on_parent(self, r: Replica, mt: MsgType, h: dict, frames: list) -> None:
        if mt is MsgType.DISCOVER:
            # the agent may ask for all replicas of this process at once (core.sed_protocol)
            mine = discover_replicas(h, r, self.replicas)
            svc = self.services.get(h["service"])
            user = h.get("user") if isinstance(h.get("user"), str) else None
            args = h.get("args") or []
            r.link.send(discover_reply(
                h, r.name, [rep.name for rep in mine],
                None if svc is None else [self.estimate(rep, svc, args, user=user) for rep in mine],
                address=self.address, public_key=self._public_key, idempotent=svc is None or svc.idempotent))
        elif mt is MsgType.PING:
            r.link.send(m.make(MsgType.PONG, h["id"], name=r.name))

    def estimate(self, r: Replica, svc: Service, args_light: list, user: str | None = None) -> dict:
        """The estimation vector of replica ``r`` for ``svc``: the back-end's
        tags, then the service's own estimation function on top."""
        vec = self.execution.estimate(r, svc, user, time.time())
        if refs_in_light(args_light):         # locality: bytes to fetch for this request (0: holds the data)
            vec["fetch_bytes"] = self.data.fetch_bytes(r.name, args_light)
        if svc.estimate is not None:
            try:
                extra = svc.estimate(dict(vec), args_light)
                if isinstance(extra, dict):
                    vec.update(extra)
            except Exception:  # noqa: BLE001
                log.exception("estimation function of %s failed; standard tags only", svc.name)
        return vec

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.orphan_call_timeout / 4))
            self.host.refresh()
            self.sweep_orphans(time.time())

    def statistics(self) -> dict:
        return {"name": self.name, "address": self.address, "replicas": len(self.replicas), "workers": 0,
                **self.stats, "bad_messages": self.endpoint.stats.bad_messages,
                "queues": {n: r.scheduler.statistics() for n, r in self.replicas.items()},
                "results": self.lifecycle.statistics(), "endpoint": self.endpoint.stats.snapshot(),
                "bulk": self.endpoint.bulk_stats,
                **self.execution.statistics(), "data": self.data.statistics()}


def _runs_elsewhere(*args, **kwargs):  # pragma: no cover - never called: the back-end runs it elsewhere
    raise RuntimeError("this service runs on the SeD's batch jobs or VMs only")
