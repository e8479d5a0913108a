"""A gevent-friendly gridrpc client on ``zmq.green`` (for locust).

:class:`gridrpc.Client` runs an asyncio loop in a background thread; under
gevent's monkey-patching (which locust applies on import) that thread becomes
a greenlet and its selector blocks the gevent hub, freezing every simulated
user. :class:`GreenClient` speaks the same wire protocol
(:mod:`gridrpc.core.messages`, :mod:`gridrpc.core.codec`) with ``zmq.green``
sockets instead: waiting for a reply only parks the calling greenlet.

It does what :class:`gridrpc.AsyncClient` does for a call — discovery through
the MA, CALL straight to the first SeD, ACCEPTED within ``ack_timeout`` (else
the next candidate), RESULT or ERROR (rebuilt with
:func:`gridrpc.errors.error_from_wire`), pings while a call runs, CANCEL on
timeout — and raises the same exception classes. It is safe to share between
greenlets: one reader greenlet per socket dispatches replies by request id.

Every call leaves a :class:`Record` in ``client.last`` (and in
``client.records`` when ``keep_records``): what it was, its latency measured
here (``time.perf_counter``), the size of the answer and the server. The
locust user reports these to locust; tests compare the two.

::

    c = GreenClient("tcp://127.0.0.1:5555")
    c.call("add", 1, 2)                     # discovery + call
    servers = c.discover("add", 3)
    h = c.bind("add")                       # discover once, then call the SeD directly
    h(1, 2)
    c.close()
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import gevent
import gevent.event
import zmq
import zmq.green as zmqg

from ..client.call import ServerInfo
from ..core import codec
from ..transport.channel import configure_context
from ..core import messages as m
from ..core.messages import MsgType
from ..errors import (CommunicationError, GridRPCError, NoServerAvailable, ProtocolError,
                      ServiceNotFound, Timeout, error_from_wire)

log = logging.getLogger(__name__)
_ctx: zmqg.Context | None = None


def context() -> zmqg.Context:
    """The process's green zmq context (separate from the asyncio one)."""
    global _ctx
    if _ctx is None or _ctx.closed:
        _ctx = configure_context(zmqg.Context())
    return _ctx


def default_user() -> str:
    from ..client.aio import default_user as du
    return du()


@dataclass(slots=True)
class Record:
    """One request as measured by the client."""
    kind: str                 # call | discover | bound
    service: str
    ms: float                 # wall time, perf_counter, from first send to the decoded answer
    size: int = 0             # bytes of the answer frames
    server: str = ""
    error: str = ""           # exception type name when it failed
    discover_ms: float = 0.0  # part of ``ms`` spent in discovery (kind call)


@dataclass
class _Attempt:
    id: str
    server: str
    accepted: gevent.event.AsyncResult = field(default_factory=gevent.event.AsyncResult)
    result: gevent.event.AsyncResult = field(default_factory=gevent.event.AsyncResult)
    last_news: float = field(default_factory=time.monotonic)


class _Socket:
    """A green DEALER plus the greenlet reading it."""

    def __init__(self, address: str, on_message, name: str) -> None:
        s = context().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100000)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.RECONNECT_IVL, 100)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        s.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        try:
            s.connect(address)
        except zmq.ZMQError as exc:
            s.close()
            raise CommunicationError(f"cannot connect to {address}: {exc}") from exc
        self.sock, self.address, self.name = s, address, name
        self.on_message = on_message
        self.closed = False
        self.reader = gevent.spawn(self._read)

    def send(self, frames: list) -> None:
        if self.closed:
            raise CommunicationError(f"{self.name}: socket closed")
        big = any(len(f) >= 65536 for f in frames)
        try:
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=not big)
        except zmq.Again as exc:
            raise CommunicationError(f"{self.name}: peer not reachable (send would block)") from exc
        except zmq.ZMQError as exc:
            raise CommunicationError(f"{self.name}: send failed: {exc}") from exc

    def _read(self) -> None:
        while not self.closed:
            try:
                frames = self.sock.recv_multipart(copy=False)
            except zmq.ZMQError:
                return
            try:
                self.on_message(frames)
            except Exception:  # a bug here must not kill the reader
                log.exception("%s: error while handling a message", self.name)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.reader.kill(block=True, timeout=1)
        self.sock.close(linger=0)


class GreenClient:
    """A gridrpc client for gevent (locust). Same errors as :class:`gridrpc.Client`.

    ``timeout`` bounds a whole call (discovery included); ``discovery_timeout``
    one discovery; ``ack_timeout`` the wait for a SeD's ACCEPTED before the
    next candidate is tried; a running call whose SeD stays silent to pings for
    ``ping_timeout`` fails over (``failover``) or raises CommunicationError.
    """

    def __init__(self, master_agent: str | None = None, *, user: str | None = None,
                 timeout: float | None = 60.0, discovery_timeout: float = 5.0,
                 discovery_budget: float | None = None, ack_timeout: float = 5.0,
                 ping_interval: float = 1.0, ping_timeout: float = 4.0, failover: bool = True,
                 max_candidates: int = 3, aggregator: Any = None, keep_records: bool = False) -> None:
        self.master_agent = master_agent
        self.user = user or default_user()
        self.timeout = timeout
        self.discovery_timeout = discovery_timeout
        self.discovery_budget = (discovery_budget if discovery_budget is not None
                                 else max(0.05, discovery_timeout * 0.6))
        self.ack_timeout = ack_timeout
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.failover = failover
        self.max_candidates = max_candidates
        self.aggregator = aggregator
        self.keep_records = keep_records
        self.records: list[Record] = []
        self.last: Record | None = None
        self._ma: _Socket | None = None
        self._seds: dict[str, _Socket] = {}
        self._pending: dict[str, gevent.event.AsyncResult] = {}
        self._attempts: dict[str, _Attempt] = {}
        self._addresses: dict[str, str] = {}
        self.closed = False

    # -- lifecycle --------------------------------------------------------
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        err = CommunicationError("client closed")
        for r in list(self._pending.values()):
            if not r.ready():
                r.set_exception(err)
        for a in list(self._attempts.values()):
            _fail(a, err)
        if self._ma:
            self._ma.close()
        for s in self._seds.values():
            s.close()

    def __enter__(self) -> "GreenClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the MA -----------------------------------------------------------
    def _on_ma(self, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            log.warning("bad message from the MA: %s", exc)
            return
        r = self._pending.pop(h["id"], None)
        if r is not None and not r.ready():
            r.set((mt, h, sum(len(f) for f in frames)))

    def _ma_request(self, header: dict, timeout: float) -> tuple[MsgType, dict, int]:
        if self.closed:
            raise CommunicationError("client is closed")
        if not self.master_agent:
            raise ServiceNotFound("this client has no master agent: give servers by address")
        if self._ma is None:
            self._ma = _Socket(self.master_agent, self._on_ma, "client->MA")
        r = gevent.event.AsyncResult()
        self._pending[header["id"]] = r
        try:
            self._ma.send([m.dumps(header)])
            return r.get(timeout=timeout)
        except gevent.Timeout:
            raise CommunicationError(f"the master agent at {self.master_agent} did not answer "
                                     f"within {timeout}s") from None
        finally:
            self._pending.pop(header["id"], None)

    def _discover(self, service: str, k: int, aggregator: Any, args: tuple,
                  timeout: float | None = None) -> tuple[list[ServerInfo], int]:
        h = m.make(MsgType.DISCOVER, _new_id(), service=service, k=int(k), user=self.user,
                   aggregator=aggregator if aggregator is not None else self.aggregator,
                   budget_ms=self.discovery_budget * 1000, optional=False,
                   args=[codec.light_description(a) for a in args])
        wait = self.discovery_timeout if timeout is None else min(self.discovery_timeout, timeout)
        mt, r, size = self._ma_request(h, wait)
        if mt is MsgType.ERROR:
            raise error_from_wire(r["error"])
        servers = [ServerInfo(name=s["name"], address=s["address"], estimation=s.get("estimation") or {})
                   for s in r.get("servers", []) if isinstance(s, dict) and "name" in s and "address" in s]
        for s in servers:
            self._addresses[s.name] = s.address
        return servers, size

    def discover(self, service: str, k: int = 10, *, aggregator: Any = None, args: tuple = ()) -> list[ServerInfo]:
        """Ranked servers (best first) offering ``service``: min(k, available)."""
        t0 = time.perf_counter()
        try:
            servers, size = self._discover(service, k, aggregator, args)
        except GridRPCError as exc:
            self._record("discover", service, t0, error=type(exc).__name__)
            raise
        self._record("discover", service, t0, size=size, server=servers[0].name if servers else "")
        return servers

    def services(self) -> dict:
        """The catalogue: service -> {doc, params, servers}."""
        mt, r, _ = self._ma_request(m.make(MsgType.SERVICES, _new_id()), self.discovery_timeout)
        if mt is MsgType.ERROR:
            raise error_from_wire(r["error"])
        self._addresses.update({k: v for k, v in (r.get("servers") or {}).items() if v})
        return r["services"]

    def resolve(self, server: str | ServerInfo) -> ServerInfo:
        """A SeD by name, ``tcp://host:port#name`` or ``tcp://host:port``."""
        if isinstance(server, ServerInfo):
            return server
        if "://" in server:
            addr, _, name = server.partition("#")
            return ServerInfo(name=name, address=addr)
        if server not in self._addresses:
            self.services()
        if server not in self._addresses:
            raise NoServerAvailable(f"no server named {server!r} in the tree")
        return ServerInfo(name=server, address=self._addresses[server])

    # -- calls ------------------------------------------------------------
    def call(self, service: str, *args, server: str | ServerInfo | None = None,
             timeout: float | None = None, aggregator: Any = None, **kwargs) -> Any:
        """Call ``service``: discovery then the SeD, or straight to ``server``
        (a name, an address or a :class:`ServerInfo`) — recorded as ``bound``."""
        kind = "call" if server is None else "bound"
        t0 = time.perf_counter()
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        disc_ms = 0.0
        try:
            buffers: list = []
            tree_args = codec.encode(list(args), buffers)
            tree_kwargs = codec.encode(dict(kwargs), buffers)
            if server is None:
                k = self.max_candidates if self.failover else 1
                candidates, _ = self._discover(service, k, aggregator, (), _left(deadline))
                disc_ms = (time.perf_counter() - t0) * 1000
                if not candidates:
                    raise NoServerAvailable(f"no server available for {service!r}")
            else:
                candidates = [self.resolve(server)]
            value, size, srv = self._dispatch(service, candidates, tree_args, tree_kwargs, buffers, deadline)
        except GridRPCError as exc:
            self._record(kind, service, t0, error=type(exc).__name__, discover_ms=disc_ms)
            raise
        self._record(kind, service, t0, size=size, server=srv, discover_ms=disc_ms)
        return value

    def bind(self, service: str, k: int = 1, *, pick: int = 0) -> "GreenHandle":
        """Discover ``service`` once and return a handle bound to the
        ``pick``-th best server (modulo the number found)."""
        servers = self.discover(service, max(k, pick + 1))
        if not servers:
            raise NoServerAvailable(f"no server available for {service!r}")
        return GreenHandle(self, service, servers[pick % len(servers)])

    def handle(self, service: str, server: str | ServerInfo | None = None) -> "GreenHandle":
        return GreenHandle(self, service, server)

    def _dispatch(self, service, candidates, tree_args, tree_kwargs, buffers, deadline):
        errors: list[str] = []
        for i, srv in enumerate(candidates):
            last = i == len(candidates) - 1 or not self.failover
            a = self._send_call(service, srv, tree_args, tree_kwargs, buffers)
            try:
                try:
                    a.accepted.get(timeout=_left(deadline, self.ack_timeout))
                except gevent.Timeout:
                    self._cancel(a, srv)
                    if deadline is not None and time.monotonic() >= deadline:
                        raise Timeout(f"call to {service} timed out before {srv.name} accepted it") from None
                    errors.append(f"{srv.name}: no answer within {self.ack_timeout}s")
                    if last:
                        break
                    continue
                except (CommunicationError, NoServerAvailable, ServiceNotFound) as exc:
                    if last and not isinstance(exc, CommunicationError):
                        raise
                    errors.append(f"{srv.name}: {exc}")
                    if last:
                        break
                    continue
                try:
                    return self._wait_result(a, srv, deadline, service)
                except CommunicationError as exc:
                    if last:
                        raise
                    errors.append(f"{srv.name}: {exc}")
                    continue
            finally:
                self._attempts.pop(a.id, None)
        raise CommunicationError(f"no candidate server could run {service}: " + "; ".join(errors))

    def _wait_result(self, a: _Attempt, srv: ServerInfo, deadline, service):
        while True:
            wait = _left(deadline, self.ping_interval)
            try:
                return a.result.get(timeout=wait)
            except gevent.Timeout:
                pass
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self._cancel(a, srv)
                raise Timeout(f"call to {service} on {srv.name} timed out")
            if now - a.last_news > self.ping_timeout:
                raise CommunicationError(f"server {srv.name} ({srv.address}) stopped answering "
                                         f"for {now - a.last_news:.1f}s")
            try:
                self._sed(srv.address).send([m.dumps(m.make(MsgType.PING, _new_id(), ids=[a.id]))])
            except GridRPCError:
                pass

    def _sed(self, address: str) -> _Socket:
        s = self._seds.get(address)
        if s is None or s.closed:
            s = _Socket(address, self._on_sed, f"client->{address}")
            self._seds[address] = s
        return s

    def _send_call(self, service, srv: ServerInfo, tree_args, tree_kwargs, buffers) -> _Attempt:
        if self.closed:
            raise CommunicationError("client is closed")
        a = _Attempt(id=_new_id(), server=srv.name)
        self._attempts[a.id] = a
        header = m.make(MsgType.CALL, a.id, service=service, args=tree_args, kwargs=tree_kwargs,
                        user=self.user, optional=False)
        if srv.name:
            header["sed"] = srv.name
        try:
            self._sed(srv.address).send([m.dumps(header), *buffers])
        except GridRPCError as exc:
            _fail(a, CommunicationError(str(exc)))
        return a

    def _cancel(self, a: _Attempt, srv: ServerInfo) -> None:
        h = m.make(MsgType.CANCEL, a.id)
        if srv.name:
            h["sed"] = srv.name
        try:
            self._sed(srv.address).send([m.dumps(h)])
        except GridRPCError:
            pass

    def _on_sed(self, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            log.warning("bad message from a SeD: %s", exc)
            return
        now = time.monotonic()
        if mt is MsgType.PONG:
            for cid, state in (h.get("calls") or {}).items():
                a = self._attempts.get(cid)
                if a is None:
                    continue
                if state == "unknown" and a.accepted.ready():
                    _fail(a, CommunicationError(f"{a.server} lost call {cid} (restarted?)"))
                else:
                    a.last_news = now
            return
        a = self._attempts.get(h["id"])
        if a is None:
            return                      # late answer, cancel ack, duplicate
        a.last_news = now
        if mt is MsgType.ACCEPTED:
            if not a.accepted.ready():
                a.accepted.set(h.get("sed"))
        elif mt is MsgType.RESULT:
            try:
                value = codec.decode(h.get("value"), [f.buffer for f in frames[1:]])
            except ProtocolError as exc:
                _fail(a, exc)
                return
            if not a.accepted.ready():
                a.accepted.set(h.get("server"))
            if not a.result.ready():
                a.result.set((value, sum(len(f) for f in frames), h.get("server") or a.server))
        elif mt is MsgType.ERROR:
            _fail(a, error_from_wire(h["error"], server=h.get("server") or a.server))

    # -- records ----------------------------------------------------------
    def _record(self, kind: str, service: str, t0: float, **kw) -> None:
        rec = Record(kind=kind, service=service, ms=(time.perf_counter() - t0) * 1000, **kw)
        self.last = rec
        if self.keep_records:
            self.records.append(rec)


class GreenHandle:
    """A service bound to one server (no discovery per call); ``server=None``
    means discovery on every call."""

    def __init__(self, client: GreenClient, service: str, server: str | ServerInfo | None = None) -> None:
        self.client, self.service, self.server = client, service, server

    def __call__(self, *args, **kwargs):
        return self.client.call(self.service, *args, server=self.server, **kwargs)

    def __repr__(self) -> str:
        s = self.server.name if isinstance(self.server, ServerInfo) else self.server
        return f"<GreenHandle {self.service} on {s or '(discovery)'}>"


def _fail(a: _Attempt, exc: BaseException) -> None:
    for r in (a.accepted, a.result):
        if not r.ready():
            r.set_exception(exc)


def _left(deadline: float | None, cap: float | None = None) -> float | None:
    if deadline is None:
        return cap
    left = max(0.0, deadline - time.monotonic())
    return left if cap is None else min(left, cap)


def _new_id() -> str:
    return uuid.uuid4().hex
