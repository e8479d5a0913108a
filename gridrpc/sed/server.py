"""The SeD (Server Daemon) runtime.

One process holds one or more *replicas* (``replicas=N``): each is its own
element of the tree (own name, own queue, own link to the parent) but they
share the process's client socket and worker pool, so hundreds of SeDs fit on
two cores. Clients address a replica by ``sed`` name in the CALL header.

Per call: decode and check the arguments, queue it in the replica's pure
:class:`~gridrpc.core.queue.SedScheduler`, acknowledge (ACCEPTED), run it in a
worker process when the scheduler says Start, kill the worker when it says
Kill (cancel or preemption), reply RESULT or ERROR. A SeD never runs the same
request id twice: duplicates are re-acknowledged, finished ones answered from
a small cache of recent results.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core import codec
from ..core import messages as m
from ..core.estimation import RunTimePredictor, queue_tags
from ..core.messages import MsgType
from ..core.queue import Kill, Request, SedScheduler, Start, make_policy
from ..errors import ConfigError, GridRPCError, InvalidArgument, ProtocolError
from ..files import FileSink, read_file
from ..transport.channel import Channel, bind_router, host_of
from ..transport.parent_link import ParentLink
from .hostinfo import HostInfo
from .services import Service, load_spec, make_service
from .workers import WorkerGone, WorkerPool

log = logging.getLogger(__name__)
DEFAULT_MAX_MESSAGE = 512 * 1024 * 1024


@dataclass
class _Call:
    id: str
    route: list
    replica: "Replica"
    service: Service
    args: list
    kwargs: dict
    user: str
    optional: bool
    received: float
    workdir: str | None = None
    started: float | None = None
    task: asyncio.Task | None = None
    state: str = "queued"
    ack_timer: asyncio.TimerHandle | None = None
    options: dict = field(default_factory=dict)    # per-call options of a SeD variant (batch: _batch)


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


class SeD:
    """A server daemon offering services. See the README for the decorator API."""

    server_type = "serial"
    ack_delay = 0.02        # s; 0 = acknowledge every call at once (batch and cloud SeDs)

    def __init__(self, name: str, parent: str | None = None, *, address: str = "tcp://127.0.0.1:0",
                 max_concurrent: int = 1, queue: str = "fcfs", replicas: int = 1,
                 workers: int | None = None, isolation: str = "process",
                 hb_interval: float = 1.0, hb_timeout: float = 3.0,
                 max_message_size: int = DEFAULT_MAX_MESSAGE, orphan_timeout: float | None = None,
                 seed: int | None = None, queue_options: dict | None = None) -> None:
        if max_concurrent < 1:
            raise ConfigError("max_concurrent must be >= 1")
        if replicas < 1:
            raise ConfigError("replicas must be >= 1")
        if isolation not in ("process", "inline"):
            raise ConfigError("isolation must be 'process' or 'inline'")
        try:
            make_policy(queue, **(queue_options or {}))   # validate early: clear errors
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.name = name
        self.parent = parent
        self.bind_address = address
        self.max_concurrent = max_concurrent
        self.queue_name = queue
        self.queue_options = queue_options or {}
        self.isolation = isolation
        self.hb_interval = hb_interval
        self.hb_timeout = hb_timeout
        self.max_message_size = max_message_size
        self.orphan_timeout = orphan_timeout
        self.services: dict[str, Service] = {}
        self._fns: dict[str, Callable] = {}
        rng = random.Random(seed)
        width = len(str(replicas))
        names = [name] if replicas == 1 else [f"{name}-{i:0{width}d}" for i in range(1, replicas + 1)]
        self.replicas: dict[str, Replica] = {
            n: Replica(name=n, scheduler=SedScheduler(policy=make_policy(queue, **self.queue_options),
                                                      max_concurrent=max_concurrent,
                                                      rng=random.Random(rng.random())))
            for n in names}
        self.pool = WorkerPool(self._fns, size=workers or max(2, replicas * max_concurrent))
        self.calls: dict[str, _Call] = {}
        self.recent: collections.OrderedDict[str, list] = collections.OrderedDict()
        self.address: str | None = None
        self.router: Channel | None = None
        self.host = HostInfo()
        self._tasks: list[asyncio.Task] = []
        self.started = time.time()
        self.stats = {"calls": 0, "bad_messages": 0, "rejected": 0, "cancelled": 0, "preempted": 0}
        self.closed = asyncio.Event()
        self._closing = False
        self.tmpdir = tempfile.mkdtemp(prefix="gridrpc-sed-")
        self._workdirs = 0

    # -- services -------------------------------------------------------
    def service(self, name: str | None = None, *, estimate: Callable | None = None, doc: str | None = None,
                aggregator: Any = None):
        """Decorator: ``@sed.service("add")``. ``estimate(vector, args)`` may
        return a dict of tags that add to or override the standard ones.
        ``aggregator`` (a name or ``{"name", "params"}``) ranks this service's
        servers when a request names none; agents honour it only if the name
        is registered on them (built-ins and the operator's plugins)."""
        if callable(name):  # used as @sed.service without parentheses
            fn, name = name, None
            self.add_service(fn.__name__, fn)
            return fn

        def deco(fn):
            self.add_service(name or fn.__name__, fn, estimate=estimate, doc=doc, aggregator=aggregator)
            return fn
        return deco

    def add_service(self, name: str, fn: Callable | str, *, estimate: Callable | None = None,
                    doc: str | None = None, aggregator: Any = None) -> None:
        if isinstance(fn, str):
            svc = load_spec(f"{name}={fn}")
            if aggregator is not None:
                svc.aggregator = aggregator
        else:
            svc = make_service(name, fn, doc=doc, estimate=estimate, aggregator=aggregator)
        self.services[svc.name] = svc
        self._fns[svc.name] = svc.fn
        if self.pool.loop is not None:
            self.pool.services_changed()
            self._announce()

    def remove_service(self, name: str) -> None:
        if self.services.pop(name, None) is not None:
            self._fns.pop(name, None)
            if self.pool.loop is not None:
                self.pool.services_changed()
                self._announce()

    def _announce(self) -> None:
        for r in self.replicas.values():
            if r.link:
                r.link.update()

    # -- lifecycle ------------------------------------------------------
    async def start(self) -> "SeD":
        sock, self.address = bind_router(self.bind_address)
        self.router = Channel(sock, self._on_router, name=f"{self.name}.router")
        if self.isolation == "process":
            self.pool.start()
        else:
            self.pool.loop = asyncio.get_running_loop()
        if self.parent:
            for r in self.replicas.values():
                r.link = ParentLink(
                    name=r.name, parent=self.parent,
                    register_info=lambda r=r: self._register_info(r),
                    heartbeat_info=lambda r=r: {"load": self._load(r)},
                    on_message=lambda mt, h, frames, r=r: self._on_parent(r, mt, h, frames),
                    hb_interval=self.hb_interval, hb_timeout=self.hb_timeout,
                    orphan_timeout=self.orphan_timeout, on_orphaned=self._orphaned)
                r.link.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._housekeeping()))
        log.info("SeD %s listening on %s with %d replica(s), services: %s", self.name, self.address,
                 len(self.replicas), ", ".join(sorted(self.services)) or "(none)")
        return self

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        for t in self._tasks:
            t.cancel()
        for c in list(self.calls.values()):
            if c.task:
                c.task.cancel()
        for r in self.replicas.values():
            if r.link:
                await r.link.aclose()
        await self.pool.aclose()
        if self.router:
            self.router.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        self.closed.set()

    def _orphaned(self) -> None:
        if not any(r.scheduler.running for r in self.replicas.values()):
            log.warning("SeD %s: parent gone for good and nothing running: exiting", self.name)
            asyncio.get_running_loop().create_task(self.aclose())

    def run(self) -> None:
        """Block serving until SIGINT/SIGTERM."""
        from .._run import run_daemon
        run_daemon(self)

    # -- tree -----------------------------------------------------------
    def _register_info(self, r: Replica) -> dict:
        return {"kind": "sed", "address": self.address, "host": host_of(self.address) or socket.gethostname(),
                "pid": os.getpid(), "started": self.started,
                "services": [s.describe() for s in self.services.values()], "load": self._load(r)}

    def _load(self, r: Replica) -> dict:
        return {"num_running": len(r.scheduler.running),
                "num_waiting": len(r.scheduler.requests) - len(r.scheduler.running),
                "free_cpu": self.host.tags.get("free_cpu"), "completed": r.completed}

    def _on_parent(self, r: Replica, mt: MsgType, h: dict, frames: list) -> None:
        if mt is MsgType.DISCOVER:
            # the agent may ask for all replicas of this process at once
            names = h.get("names") if isinstance(h.get("names"), list) else [r.name]
            mine = [self.replicas[n] for n in names if n in self.replicas] or [r]
            servers = []
            svc = self.services.get(h["service"])
            if svc is not None:
                for rep in mine:
                    servers.append({"name": rep.name, "address": self.address,
                                    "estimation": self.estimate(rep, svc, h.get("args") or [])})
            reply = m.make(MsgType.SERVERS, h["id"], name=r.name, servers=servers)
            if len(mine) > 1:
                reply["names"] = [rep.name for rep in mine]
            r.link.send(reply)
        elif mt is MsgType.PING:
            r.link.send(m.make(MsgType.PONG, h["id"], name=r.name))

    def estimate(self, r: Replica, svc: Service, args_light: list) -> dict:
        now = time.time()
        sch = r.scheduler
        vec = dict(self.host.tags)
        vec["server_type"] = self.server_type
        vec.update(queue_tags(
            service=svc.name, predictor=r.predictor, now=now,
            num_waiting=len(sch.requests) - len(sch.running), num_running=len(sch.running),
            max_concurrent=sch.max_concurrent, last_solve=r.last_solve,
            running=[(start, sch.requests[rid].service) for rid, start in sch.running.items()],
            waiting_services=[q.service for q in sch.waiting()]))
        if svc.estimate is not None:
            try:
                extra = svc.estimate(dict(vec), args_light)
                if isinstance(extra, dict):
                    vec.update(extra)
            except Exception:
                log.exception("estimation function of %s failed; standard tags only", svc.name)
        return vec

    # -- client socket --------------------------------------------------
    def _send(self, route: list, header: dict, buffers: list = ()) -> None:
        try:
            self.router.send([*route, m.dumps(header), *buffers])
        except GridRPCError as exc:
            log.info("SeD %s: could not answer %s: %s", self.name, header.get("id"), exc)

    def _on_router(self, frames: list) -> None:
        try:
            route, mt, h, buffers = m.parse_routed(frames)
        except ProtocolError as exc:
            route = frames[:1]
            self.stats["bad_messages"] += 1
            log.warning("SeD %s: rejected message: %s", self.name, exc)
            self._send(route, m.error_header("", "protocol", str(exc)))
            return
        if mt is MsgType.CALL:
            self._on_call(route, h, buffers)
        elif mt is MsgType.CANCEL:
            self._on_cancel(route, h)
        elif mt is MsgType.PING:
            ids = h.get("ids") if isinstance(h.get("ids"), list) else []
            states = {i: (self.calls[i].state if i in self.calls else
                          "done" if i in self.recent else "unknown") for i in ids if isinstance(i, str)}
            for i in ids:       # the asker may have a new route (reconnected)
                if i in self.calls:
                    self.calls[i].route = route
            self._send(route, m.make(MsgType.PONG, h["id"], name=self.name, calls=states))
        else:
            self._send(route, m.error_header(h["id"], "protocol", f"a SeD does not handle {mt.value!r}"))

    def _replica_for(self, h: dict) -> Replica | None:
        target = h.get("sed")
        if target is None and len(self.replicas) == 1:
            return next(iter(self.replicas.values()))
        return self.replicas.get(target)

    def _on_call(self, route: list, h: dict, buffers: list) -> None:
        cid = h["id"]
        if cid in self.calls:               # duplicate while queued/running: re-acknowledge
            self.calls[cid].route = route
            self._send(route, m.make(MsgType.ACCEPTED, cid, sed=self.calls[cid].replica.name, duplicate=True))
            return
        if cid in self.recent:               # finished already: answer again, never run twice
            frames = self.recent[cid]
            try:
                self.router.send([*route, *frames])
            except GridRPCError:
                pass
            return
        size = sum(len(b) for b in buffers)
        if size > self.max_message_size:
            self.stats["rejected"] += 1
            self._send(route, m.error_header(cid, "too_large", f"call of {size} bytes exceeds this SeD's "
                                             f"max_message_size of {self.max_message_size} bytes"))
            return
        r = self._replica_for(h)
        if r is None:
            self.stats["rejected"] += 1
            self._send(route, m.error_header(cid, "no_server", f"no SeD named {h.get('sed')!r} here "
                                             f"(this process serves {', '.join(self.replicas)})"))
            return
        svc = self.services.get(h["service"])
        if svc is None:
            self.stats["rejected"] += 1
            self._send(route, m.error_header(cid, "service_not_found",
                                             f"SeD {r.name} does not offer {h['service']!r}"))
            return
        workdir = None
        try:
            workdir = self._call_workdir()
            sink = FileSink(workdir, as_path=True)
            copy = self.isolation != "process"      # workers get their own writable copies
            args = codec.decode(h["args"], buffers, sink, copy)
            kwargs = codec.decode(h["kwargs"], buffers, sink, copy)
            if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
                raise ProtocolError("kwargs must map names to values")
            kwargs, options = self._call_options(svc, kwargs)
            svc.check(args, kwargs)
        except (ProtocolError, InvalidArgument) as exc:
            self.stats["rejected"] += 1
            kind = "invalid_argument" if isinstance(exc, InvalidArgument) else "protocol"
            self._send(route, m.error_header(cid, kind, str(exc), type_=type(exc).__name__))
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            return
        user = str(h.get("user") or "anonymous")
        optional = bool(h.get("optional", False))
        now = time.time()
        call = _Call(id=cid, route=route, replica=r, service=svc, args=args, kwargs=kwargs, user=user,
                     optional=optional, received=now, options=options,
                     workdir=workdir)
        self.calls[cid] = call
        self.stats["calls"] += 1
        r.last_solve = now
        log.debug("SeD %s: call %s %s from %s%s", r.name, cid, svc.name, user, " (optional)" if optional else "")
        self._apply(r, r.scheduler.submit(Request(id=cid, user=user, service=svc.name, optional=optional,
                                                  submitted=now), now))
        if self.ack_delay > 0 and call.state == "running" and cid in self.calls:
            # a call that starts at once and ends quickly needs no separate ACCEPTED:
            # the RESULT acknowledges it (one message less per call)
            call.ack_timer = asyncio.get_running_loop().call_later(self.ack_delay, self._send_ack, call)
        elif cid in self.calls:
            self._send(route, m.make(MsgType.ACCEPTED, cid, sed=r.name))

    def _send_ack(self, call: _Call) -> None:
        call.ack_timer = None
        if call.id in self.calls:
            self._send(call.route, m.make(MsgType.ACCEPTED, call.id, sed=call.replica.name))

    def _on_cancel(self, route: list, h: dict) -> None:
        cid = h["id"]
        call = self.calls.get(cid)
        if call is None:
            state = "done" if cid in self.recent else "unknown"
            self._send(route, m.make(MsgType.CANCELLED, cid, state=state))
            return
        prev = call.state
        self.stats["cancelled"] += 1
        r = call.replica
        actions = r.scheduler.cancel(cid, time.time())
        if prev == "queued":        # never started: no Kill action, answer the caller here
            self._finish_call(call, m.error_header(cid, "cancelled", "call cancelled while queued",
                                                   **self._timing(call)))
        self._apply(r, actions)
        self._send(route, m.make(MsgType.CANCELLED, cid, state=prev))

    # -- execution ------------------------------------------------------
    def _apply(self, r: Replica, actions: list) -> None:
        self._apply_actions(r, actions)
        wake = r.scheduler.next_wakeup(time.time())
        if wake is not None:
            loop = asyncio.get_running_loop()
            if r.timer is not None:
                r.timer.cancel()
            r.timer = loop.call_later(max(0.0, wake - time.time()) + 0.001, self._tick, r)

    def _tick(self, r: Replica) -> None:
        r.timer = None
        self._apply(r, r.scheduler.tick(time.time()))

    def _apply_actions(self, r: Replica, actions: list) -> None:
        for a in actions:
            call = self.calls.get(a.request_id)
            if call is None:
                continue
            if isinstance(a, Start):
                call.state = "running"
                call.started = time.time()
                call.task = asyncio.get_running_loop().create_task(self._execute(call))
            elif isinstance(a, Kill):
                call.state = "killed"
                if a.reason == "preempted":
                    self.stats["preempted"] += 1
                self._kill_call(call)
                kind = "preempted" if a.reason == "preempted" else "cancelled"
                self._finish_call(call, m.error_header(
                    call.id, kind, f"call {a.reason} on {r.name}" + (
                        " (a mandatory request needed the server)" if kind == "preempted" else ""),
                    **self._timing(call)))

    # -- hooks for SeD variants (the batch SeD overrides these) -----------
    def _call_workdir(self) -> str:
        """A new directory name for the files of one call (created only when
        files arrive; removed when the call ends). Never derived from anything
        in the message: the request id is the client's to choose."""
        self._workdirs += 1
        return os.path.join(self.tmpdir, f"call-{self._workdirs}")

    def _call_options(self, svc: Service, kwargs: dict) -> tuple[dict, dict]:
        """Split reserved keyword arguments (per-call options of a SeD variant,
        e.g. the batch SeD's ``_batch``) from the service's own: returns
        ``(kwargs, options)``; raises InvalidArgument on bad options. None here."""
        return kwargs, {}

    def _kill_call(self, call: _Call) -> None:
        """Stop a running call (cancel or preemption); the caller answers the client."""
        killed = self.pool.kill(call.id) if self.isolation == "process" else False
        if not killed and call.task:
            call.task.cancel()

    def _timing(self, call: _Call) -> dict:
        return {"server": call.replica.name, "timing": {
            "received": call.received, "started": call.started, "ended": time.time()}}

    async def _execute(self, call: _Call) -> None:
        r = call.replica
        try:
            if self.isolation == "process":
                ok, value = await self.pool.run(call.id, call.service.name, call.args, call.kwargs)
            else:
                ok, value = await _run_inline(call.service.fn, call.args, call.kwargs)
        except WorkerGone as exc:
            if exc.killed or call.state == "killed":
                return              # answered by the Kill action
            r.failed += 1
            header = m.error_header(call.id, "worker_died",
                                    f"the worker process running {call.service.name} died "
                                    f"(exit code {exc.exitcode}); the SeD is still serving",
                                    type_="WorkerDied", **self._timing(call))
            self._done(call, header)
            return
        except asyncio.CancelledError:
            return
        if call.state == "killed":
            return
        if ok:
            buffers: list = []
            try:
                tree = codec.encode(value, buffers, read_file)
                header = m.make(MsgType.RESULT, call.id, value=tree, **self._timing(call))
                r.predictor.observe(call.service.name, time.time() - call.started)
                r.completed += 1
                self._done(call, header, buffers)
                return
            except GridRPCError as exc:
                value = (type(exc).__name__, f"the result cannot be sent: {exc}", "")
        r.failed += 1
        rtype, msg, tb = value
        self._done(call, m.error_header(call.id, "remote", msg, type_=rtype, traceback=tb, **self._timing(call)))

    def _done(self, call: _Call, header: dict, buffers: list = ()) -> None:
        self._finish_call(call, header, buffers)
        r = call.replica
        self._apply(r, r.scheduler.finished(call.id, time.time()))

    def _finish_call(self, call: _Call, header: dict, buffers: list = ()) -> None:
        if self.calls.pop(call.id, None) is None:
            return
        if call.ack_timer is not None:
            call.ack_timer.cancel()
        frames = [m.dumps(header), *buffers]
        self.recent[call.id] = frames if sum(len(b) for b in buffers) < 1 << 20 else [m.dumps(header)]
        while len(self.recent) > 512:
            self.recent.popitem(last=False)
        try:
            self.router.send([*call.route, *frames])
        except GridRPCError as exc:
            log.info("SeD %s: result of %s not delivered: %s", self.name, call.id, exc)
        if call.workdir:
            shutil.rmtree(call.workdir, ignore_errors=True)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.host.refresh()

    def statistics(self) -> dict:
        return {"name": self.name, "address": self.address, "replicas": len(self.replicas),
                "workers": len(self.pool.workers), **self.stats,
                "queues": {n: r.scheduler.statistics() for n, r in self.replicas.items()}}


async def _run_inline(fn: Callable, args: list, kwargs: dict) -> tuple[bool, Any]:
    import inspect
    import traceback
    try:
        if inspect.iscoroutinefunction(fn):
            return True, await fn(*args, **kwargs)
        value = await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))
        if inspect.isawaitable(value):
            value = await value
        return True, value
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001
        return False, (type(exc).__name__, str(exc), traceback.format_exc())
