"""A gevent-friendly gridrpc client on ``zmq.green`` (for locust).

:class:`gridrpc.Client` runs an asyncio loop in a background thread; under
gevent's monkey-patching (which locust applies on import) that thread becomes
a greenlet and its selector blocks the gevent hub, freezing every simulated
user. :class:`GreenClient` speaks the same wire protocol
(:mod:`gridrpc.core.messages`, :mod:`gridrpc.core.codec`) with ``zmq.green``
sockets instead: waiting for a reply only parks the calling greenlet.

It runs the same call machine as :class:`gridrpc.AsyncClient`
(:mod:`gridrpc.core.call`: ACCEPTED within ``ack_timeout`` else the next
candidate, pings, the SeD's ``patience``, failover, CANCEL to every server
given up on), takes the same options (:class:`gridrpc.ClientOptions`; the
default ``timeout`` here is 60 s) and raises the same exception classes. It
is safe to share between greenlets: one reader greenlet per socket feeds the
replies to the calls' machines; the calling greenlet waits on an event.

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

import functools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.event
import zmq
import zmq.green as zmqg

from ..client.call import ServerInfo
from ..client.driver import CallDriver, Flight, exception_for
from ..client.ids import new_id
from ..client.options import ClientOptions, OptionViews
from ..client.reuse import ReusedAnswers, answer_key, server_failed
from ..core import codec
from ..core import messages as m
from ..core.call import CallMachine, Done, Tick
from ..core.messages import MsgType
from ..errors import (CommunicationError, GridRPCError, MessageTooLarge, NoServerAvailable, ProtocolError,
                      ServiceNotFound, error_from_wire)
from ..transport.channel import configure_context, routing_id

log = logging.getLogger(__name__)
_ctx: zmqg.Context | None = None
_TICK = Tick()


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


class _Socket:
    """A green DEALER plus the greenlet reading it."""

    def __init__(self, address: str, on_message, name: str) -> None:
        s = context().socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, routing_id())    # stable across reconnects (the SeD's owner check)
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


class _GreenDriver(CallDriver):
    """The call machine under gevent: the calling greenlet waits on an event,
    set by the outcome or by a wakeup that moved earlier; the reader
    greenlets feed the replies."""

    def __init__(self, client: "GreenClient") -> None:
        super().__init__(clock=time.monotonic, new_id=new_id, decode=_decode, name="green client")
        self.client = client

    def send(self, address: str, frames: list) -> None:
        self.client._sed(address).send(frames)

    def _prepare(self, flight: Flight) -> None:
        flight.waiter = gevent.event.Event()

    def _arm(self, flight: Flight) -> None:
        until = flight.waiting_until
        if until is not None:
            w = flight.machine.next_wakeup()
            if w is not None and w < until:
                flight.waiter.set()             # wake the caller: it waits for a later time

    def _finish(self, flight: Flight, outcome) -> None:
        flight.outcome = outcome
        flight.waiter.set()

    def wait(self, flight: Flight):
        """Park the calling greenlet until the call ends; its outcome."""
        try:
            while flight.outcome is None:
                w = flight.machine.next_wakeup()
                flight.waiting_until = math.inf if w is None else w
                flight.waiter.clear()
                flight.waiter.wait(None if w is None else max(0.0, w - time.monotonic()))
                flight.waiting_until = None
                if flight.outcome is None:
                    self.feed(flight, _TICK)
        except BaseException:                   # killed, gevent.Timeout...: CANCEL to the server
            flight.waiting_until = None
            self.abandon(flight)
            raise
        return flight.outcome


def _decode(header: dict, frames: list) -> tuple[Any, int]:
    return codec.decode(header.get("value"), [f.buffer for f in frames[1:]]), sum(len(f) for f in frames)


class GreenClient(OptionViews):
    """A gridrpc client for gevent (locust). Same errors as :class:`gridrpc.Client`.

    Options: the fields of :class:`gridrpc.ClientOptions` (``timeout``
    defaults to 60 s here and bounds a whole call, discovery included), plus
    ``keep_records``. ``discovery_timeout`` bounds one discovery;
    ``ack_timeout`` the wait for a SeD's ACCEPTED before the next candidate is
    tried; a running call whose SeD stays silent to pings for ``ping_timeout``
    (or the ``patience`` it announced) fails over (``failover``) or raises
    CommunicationError.
    """


    def __init__(self, master_agent: str | None = None, *, keep_records: bool = False,
                 options: ClientOptions | None = None, **kwargs: Any) -> None:
        self.options = ClientOptions.build("GreenClient", options, defaults={"timeout": 60.0}, **kwargs)
        self.master_agent = master_agent
        self.user = self.options.user or default_user()
        self.keep_records = keep_records
        self.records: list[Record] = []
        self.last: Record | None = None
        self._policy = self.options.policy()
        self._reuse = ReusedAnswers(self.options.reuse_discovery) if self.options.reuse_discovery else None
        self._driver = _GreenDriver(self)
        self._ma: _Socket | None = None
        self._seds: dict[str, _Socket] = {}
        self._pending: dict[str, gevent.event.AsyncResult] = {}
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
        self._driver.abort_all("client closed")
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
                  timeout: float | None = None) -> tuple[list[ServerInfo], int, bool]:
        """The servers, the answer's size, and whether the MA answered from its view."""
        o = self.options
        h = m.make(MsgType.DISCOVER, new_id(), service=service, k=int(k), user=self.user,
                   aggregator=aggregator if aggregator is not None else o.aggregator,
                   budget_ms=o.budget * 1000, optional=False,
                   args=[codec.light_description(a) for a in args])
        wait = o.discovery_timeout if timeout is None else min(o.discovery_timeout, timeout)
        until = time.monotonic() + (o.retry_timeout if timeout is None else timeout)
        delay = 0.05
        while True:
            mt, r, size = self._ma_request(h, wait)
            if mt is not MsgType.ERROR:
                break
            exc = error_from_wire(r["error"])
            # a restarted MA rebuilding its tree: retry, as the asyncio client does, within the budget
            if getattr(exc, "kind", None) != "rebuilding" or time.monotonic() + delay > until:
                raise exc
            gevent.sleep(delay)
            delay = min(1.0, delay * 2)
            h = dict(h, id=new_id())
        servers = [ServerInfo(name=s["name"], address=s["address"], estimation=s.get("estimation") or {})
                   for s in r.get("servers", []) if isinstance(s, dict) and "name" in s and "address" in s]
        for s in servers:
            self._addresses[s.name] = s.address
        return servers, size, r.get("view") is True

    def discover(self, service: str, k: int = 10, *, aggregator: Any = None, args: tuple = ()) -> list[ServerInfo]:
        """Ranked servers (best first) offering ``service``: min(k, available)."""
        t0 = time.perf_counter()
        try:
            servers, size, _ = self._discover(service, k, aggregator, args)
        except GridRPCError as exc:
            self._record("discover", service, t0, error=type(exc).__name__)
            raise
        self._record("discover", service, t0, size=size, server=servers[0].name if servers else "")
        return servers

    def services(self) -> dict:
        """The catalogue: service -> {doc, params, servers}."""
        mt, r, _ = self._ma_request(m.make(MsgType.SERVICES, new_id()), self.options.discovery_timeout)
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
        o = self.options
        timeout = o.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        disc_ms = 0.0
        chosen = None
        try:
            buffers: list = []
            tree_args = codec.encode(list(args), buffers)
            tree_kwargs = codec.encode(dict(kwargs), buffers)
            size = sum(len(memoryview(b).cast("B")) if not isinstance(b, bytes) else len(b) for b in buffers)
            if size > o.max_message_size:
                raise MessageTooLarge(f"arguments of {service} are {size} bytes; the maximum message "
                                      f"size is {o.max_message_size}")
            if server is None:
                k = o.max_candidates if o.failover else 1
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                reuse = self._reuse        # a view answer of the last reuse_discovery s (gridrpc.client.reuse)
                key = answer_key(service, False, k, aggregator)
                candidates = reuse.take(key, time.monotonic()) if reuse is not None else None
                if candidates is None:
                    candidates, _, from_view = self._discover(service, k, aggregator, (), left)
                    disc_ms = (time.perf_counter() - t0) * 1000
                    if reuse is not None and candidates:
                        candidates = reuse.answered(key, candidates, from_view, time.monotonic())
                if reuse is not None and candidates:
                    chosen = reuse.begin(candidates)
            else:
                candidates = [self.resolve(server)]
            value, size, srv = self._dispatch(service, candidates, tree_args, tree_kwargs, buffers, deadline,
                                              chosen)
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

    def _dispatch(self, service, candidates, tree_args, tree_kwargs, buffers, deadline, chosen=None):
        """``chosen``: the server a kept or fresh answer gave the call (``reuse_discovery``), told when it ends."""
        machine = outcome = None
        try:
            if self.closed:
                raise CommunicationError("client is closed")
            header = m.make(MsgType.CALL, "", service=service, args=tree_args, kwargs=tree_kwargs,
                            user=self.user, optional=False, ack_ms=self._policy.ack_ms)
            machine = CallMachine(service, candidates, policy=self._policy, deadline=deadline, new_id=new_id)
            outcome = self._driver.wait(self._driver.launch(machine, header, buffers))
        finally:
            if chosen is not None:
                self._reuse.ended(chosen, failed=server_failed(machine, outcome))
        if type(outcome) is Done:
            value, size = outcome.value
            return value, size, outcome.server
        raise exception_for(outcome.error)

    def _sed(self, address: str) -> _Socket:
        s = self._seds.get(address)
        if s is None or s.closed:
            if self.closed:
                raise CommunicationError("client is closed")
            s = _Socket(address, functools.partial(self._driver.on_message, address), f"client->{address}")
            self._seds[address] = s
        return s

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
