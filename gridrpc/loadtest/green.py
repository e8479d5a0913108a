"""A gevent-friendly gridrpc client (for locust).

:class:`gridrpc.Client` runs an asyncio loop in a background thread; under
gevent's monkey-patching (which locust applies on import) that thread becomes
a greenlet and its selector blocks the gevent hub, freezing every simulated
user. :class:`GreenClient` speaks the same wire protocol
(:mod:`gridrpc.core.messages`, :mod:`gridrpc.core.codec`) on plain zmq
sockets that never block (``NOBLOCK``), read by gevent I/O watchers in the
hub: waiting for a reply only parks the calling greenlet.

It drives the same call machine as :class:`gridrpc.AsyncClient`
(:mod:`gridrpc.core.client_call.machine`), discovery included: a call without a server
starts as a ``Discover`` action; the client answers it from its reuse window
(:mod:`gridrpc.client.reuse`: a view answer of the last ``reuse_discovery``
seconds, ranked again by this client's own calls), joins a discovery of the
same key already out, or asks the MA, and feeds the answer back
(``Discovered`` / ``DiscoveryFailed``). So a transient answer of the MA
(``no_server``: its children were silent; ``rebuilding``; no answer in time)
is retried with jittered backoff until the call's own deadline, a server
given up on is left out of the next discovery, and ACCEPTED within
``ack_timeout``, pings, the SeD's ``patience``, failover and CANCEL to every
server given up on are the machine's, as in the asyncio client. It takes the
same options (:class:`gridrpc.ClientOptions`; the default ``timeout`` here is
60 s) and raises the same exception classes. It is safe to share between
greenlets of one thread.

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

Its sockets and its driver of the call machine are :mod:`gridrpc.loadtest.green_io`;
docs/loadtest.md gives the CPU per call.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.event

from ..client.futures import ServerInfo
from ..client.driver import Flight, exception_for
from ..client.ids import new_id
from ..client.options import ClientOptions, OptionViews
from ..client.reuse import ReusedAnswers, answer_key, ask_again, ask_for, server_failed
from ..core import codec
from ..core import messages as m
from ..core.client_call.machine import CallMachine, Discover, Discovered, DiscoveryFailed, Done, SendCall
from ..core.messages import MsgType
from ..errors import (CommunicationError, GridRPCError, MessageTooLarge, NoServerAvailable, ProtocolError,
                      ServiceNotFound, error_from_wire, kind_of)
from ..files import read_file
from .green_io import GreenDriver, GreenSocket

log = logging.getLogger(__name__)
_CALL = MsgType.CALL
_ERROR = MsgType.ERROR
_SERVERS = MsgType.SERVERS


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
    discover_ms: float = 0.0  # part of ``ms`` spent asking the MA (kind call; 0: a kept answer served it)


class _GreenCall:
    """What the client keeps of one call (the flight's ``context``)."""

    __slots__ = ("service", "aggregator", "k", "client", "chosen", "asked_at", "sent_at")

    def __init__(self, service: str, aggregator: Any, k: int, client: "GreenClient") -> None:
        self.service, self.aggregator, self.k, self.client = service, aggregator, k, client
        self.chosen: str | None = None          # server counted in flight in the reuse window
        self.asked_at: float | None = None      # perf_counter when this call first asked the MA
        self.sent_at: float | None = None       # perf_counter of its first CALL


class _Ask:
    """A DISCOVER out for calls: the call that asked, the calls that joined
    it (same reuse key), and the timer that ends it."""

    __slots__ = ("flight", "discover", "key", "service", "k", "timer")

    def __init__(self, flight: Flight, discover: Discover, key, service: str, k: int, timer) -> None:
        self.flight, self.discover, self.key, self.service, self.k, self.timer = \
            flight, discover, key, service, k, timer

    def stop_timer(self) -> None:
        t, self.timer = self.timer, None
        if t is not None:
            t.stop()
            t.close()


def _on_attempt(flight: Flight, a: SendCall) -> None:
    call = flight.context
    if call is None:
        return
    call.client.counters["call_messages"] += 1
    if call.sent_at is None:
        call.sent_at = time.perf_counter()
    chosen = call.chosen
    if chosen is not None and chosen != a.server:   # passed on (busy probe, failover): counted where it is
        call.client._reuse.moved(chosen, a.server)
        call.chosen = a.server


class GreenClient(OptionViews):
    """A gridrpc client for gevent (locust). Same errors as :class:`gridrpc.Client`.

    Options: the fields of :class:`gridrpc.ClientOptions` (``timeout``
    defaults to 60 s here and bounds a whole call, discovery and its retries
    included), plus ``keep_records``. ``discovery_timeout`` bounds one
    discovery; ``ack_timeout`` the wait for a SeD's ACCEPTED before the next
    candidate is tried; a running call whose SeD stays silent to pings for
    ``ping_timeout`` (or the ``patience`` it announced) fails over
    (``failover``) or raises CommunicationError; ``reuse_discovery`` the
    window of kept view answers (0: every call asks the MA).
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
        self._driver = GreenDriver(self._sed, on_attempt=_on_attempt, on_discover=self._on_discover)
        self._ma: GreenSocket | None = None
        self._seds: dict[str, GreenSocket] = {}
        self._pending: dict[str, Any] = {}         # request id -> AsyncResult (a caller waits) or _Ask (calls)
        self._joining: dict[tuple, list] = {}      # reuse key -> [(flight, Discover)] waiting for the same ask
        self._addresses: dict[str, str] = {}
        self._k = self.options.max_candidates if self.options.failover else 1
        #: calls made; CALL messages sent for them (more than one per call: a busy probe passed on, a
        #: failover); DISCOVERs sent to the MA for them (fewer than calls: the reuse window, joined asks)
        self.counters = {"calls": 0, "call_messages": 0, "discover_messages": 0}
        self.closed = False

    # -- lifecycle --------------------------------------------------------
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        err = CommunicationError("client closed")
        for r in list(self._pending.values()):
            if type(r) is _Ask:
                r.stop_timer()
            elif not r.ready():
                r.set_exception(err)
        self._pending.clear()
        self._joining.clear()
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
    def _ma_socket(self) -> GreenSocket:
        if self.closed:
            raise CommunicationError("client is closed")
        if not self.master_agent:
            raise ServiceNotFound("this client has no master agent: give servers by address")
        if self._ma is None:
            self._ma = GreenSocket(self.master_agent, self._on_ma, "client->MA")
        return self._ma

    def _on_ma(self, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            log.warning("bad message from the MA: %s", exc)
            return
        r = self._pending.pop(h["id"], None)
        if r is None:
            return
        if type(r) is _Ask:
            self._answered(r, mt, h)
        elif not r.ready():
            r.set((mt, h, sum(len(f) for f in frames)))

    def _ma_request(self, header: dict, timeout: float) -> tuple[MsgType, dict, int]:
        """Send ``header`` to the MA and park this greenlet until it answers."""
        sock = self._ma_socket()
        r = gevent.event.AsyncResult()
        self._pending[header["id"]] = r
        try:
            sock.send([m.dumps(header)])
            return r.get(timeout=timeout)
        except gevent.Timeout:
            raise CommunicationError(f"the master agent at {self.master_agent} did not answer "
                                     f"within {timeout}s") from None
        finally:
            self._pending.pop(header["id"], None)

    def _discover_header(self, service: str, k: int, aggregator: Any, args: tuple) -> dict:
        o = self.options
        return m.make(MsgType.DISCOVER, new_id(), service=service, k=int(k), user=self.user,
                      aggregator=aggregator if aggregator is not None else o.aggregator,
                      budget_ms=o.budget * 1000, optional=False,
                      args=[codec.light_description(a) for a in args])

    def _servers(self, r: dict) -> list[ServerInfo]:
        out = []
        addresses = self._addresses
        for s in r.get("servers") or ():
            if type(s) is dict and "name" in s and "address" in s:
                info = ServerInfo(name=s["name"], address=s["address"], estimation=s.get("estimation") or {},
                                  idempotent=s.get("idempotent") is not False)
                addresses[info.name] = info.address
                out.append(info)
        return out

    def discover(self, service: str, k: int = 10, *, aggregator: Any = None, args: tuple = ()) -> list[ServerInfo]:
        """Ranked servers (best first) offering ``service``: min(k, available).
        One request to the MA (as ``AsyncClient.discover``: the reuse window
        and the retries are the calls')."""
        t0 = time.perf_counter()
        try:
            mt, r, size = self._ma_request(self._discover_header(service, k, aggregator, args),
                                           self.options.discovery_timeout)
            if mt is _ERROR:
                raise error_from_wire(r["error"])
            servers = self._servers(r)
        except GridRPCError as exc:
            self._record("discover", service, t0, error=type(exc).__name__)
            raise
        self._record("discover", service, t0, size=size, server=servers[0].name if servers else "")
        return servers

    def services(self) -> dict:
        """The catalogue: service -> {doc, params, servers}."""
        mt, r, _ = self._ma_request(m.make(MsgType.SERVICES, new_id()), self.options.discovery_timeout)
        if mt is _ERROR:
            raise error_from_wire(r["error"])
        self._addresses.update({k: v for k, v in (r.get("servers") or {}).items() if v})
        return r["services"]

    def resolve(self, server: str | ServerInfo) -> ServerInfo:
        """A SeD by name, ``tcp://host:port#name`` or ``tcp://host:port``."""
        if type(server) is ServerInfo:
            return server
        if "://" in server:
            addr, _, name = server.partition("#")
            return ServerInfo(name=name, address=addr)
        if server not in self._addresses:
            self.services()
        if server not in self._addresses:
            raise NoServerAvailable(f"no server named {server!r} in the tree")
        return ServerInfo(name=server, address=self._addresses[server])

    # -- discovery for calls (the machine's Discover actions) ---------------
    def _on_discover(self, flight: Flight, a: Discover) -> Discovered | DiscoveryFailed | None:
        """A kept view answer at once; else join a discovery of the same key
        already out; else ask the MA (the answer is fed back from the MA's
        socket). As :meth:`gridrpc.AsyncClient._on_discover`."""
        call = flight.context
        reuse, key = self._reuse, None
        if reuse is not None and not self.closed:
            key = answer_key(call.service, False, call.k, call.aggregator)
            now = self._driver.clock()
            servers = reuse.take(key, now)
            if servers is not None:
                return self._seat(call, servers, call.k, now)
            if call.asked_at is None:
                call.asked_at = time.perf_counter()
            joined = self._joining.get(key)
            if joined is not None:              # the same request is out: its answer serves this call too
                joined.append((flight, a))
                return None
            self._joining[key] = []
        return self._ask(flight, a, key)

    def _ask(self, flight: Flight, a: Discover, key) -> DiscoveryFailed | None:
        """Send a DISCOVER for ``flight`` (and the calls that join it under ``key``)."""
        call = flight.context
        asked = call.k
        if key is not None:         # a server per call waiting for this answer and per server taken (reuse.py)
            asked = ask_for(call.k, 1 + len(self._joining.get(key, ())), len(self._reuse.in_flight))
        h = self._discover_header(call.service, asked, call.aggregator, ())
        timeout = self.options.discovery_timeout
        if a.timeout is not None and a.timeout < timeout:
            timeout = max(0.01, a.timeout)
        try:
            sock = self._ma_socket()
            rid = h["id"]
            ask = _Ask(flight, a, key, call.service, call.k, None)
            self._pending[rid] = ask
            sock.send([m.dumps(h)])
            self.counters["discover_messages"] += 1
        except GridRPCError as exc:
            self._pending.pop(h["id"], None)
            joined = self._joining.pop(key, []) if key is not None else []
            event = DiscoveryFailed(kind_of(exc), str(exc))
            for f, _own in joined:
                self._driver.feed(f, event)
            return event
        if call.asked_at is None:
            call.asked_at = time.perf_counter()
        timer = ask.timer = gevent.get_hub().loop.timer(timeout)
        timer.start(self._ask_timed_out, rid, timeout)
        return None

    def _ask_timed_out(self, rid: str, timeout: float) -> None:
        ask = self._pending.pop(rid, None)
        if type(ask) is not _Ask:
            return
        ask.stop_timer()
        self._settle(ask, DiscoveryFailed("timeout", f"discovery of {ask.service} timed out: the master agent "
                                                     f"at {self.master_agent} did not answer within {timeout:.3g}s"),
                     [], False)

    def _answered(self, ask: _Ask, mt: MsgType, h: dict) -> None:
        ask.stop_timer()
        if mt is _ERROR:
            exc = error_from_wire(h["error"])
            self._settle(ask, DiscoveryFailed(kind_of(exc), str(exc)), [], False)
        elif mt is _SERVERS:
            servers = self._servers(h)
            self._settle(ask, Discovered(servers), servers, h.get("view") is True)
        else:
            self._settle(ask, DiscoveryFailed("protocol", f"unexpected {mt.value!r} answer to a discovery"),
                         [], False)

    def _settle(self, ask: _Ask, event, servers: list, from_view: bool) -> None:
        """Feed the answer to the call that asked and to those that joined it,
        each with the answer ranked for itself; the joiners it cannot seat
        ask again, as one discovery. As ``AsyncClient._discover_for``."""
        key, flight, k = ask.key, ask.flight, ask.k
        reuse = self._reuse
        calls = [(flight, ask.discover)] + (self._joining.pop(key, []) if key is not None else [])
        feed = self._driver.feed
        again: list = []
        if type(event) is Discovered and reuse is not None and servers:
            now = self._driver.clock()
            again = reuse.settle(key, servers, from_view, now, calls, flight,
                                 lambda f, ranked: feed(f, self._seat(f.context, ranked, k, now)))
        else:
            for f, _own in calls:
                if not f.machine.finished:
                    feed(f, event)
        first = ask_again(self._joining, key, again)
        if first is not None:
            f, own = first
            follow = self._ask(f, own, key)
            if follow is not None:
                feed(f, follow)

    def _seat(self, call: _GreenCall, ranked: list, k: int, now: float) -> Discovered:
        """``call`` takes the answer ``ranked`` for it: counted in flight on
        its first server, its first ``k`` servers as candidates, a probe when
        that server is free by this client's count, else queued there."""
        reuse = self._reuse
        free = reuse.free(ranked, now)
        call.chosen = reuse.begin(ranked)
        return Discovered(ranked[:k], free)

    # -- calls ------------------------------------------------------------
    def call(self, service: str, *args, server: str | ServerInfo | None = None,
             timeout: float | None = None, aggregator: Any = None, **kwargs) -> Any:
        """Call ``service``: discovery then the SeD, or straight to ``server``
        (a name, an address or a :class:`ServerInfo`) — recorded as ``bound``."""
        t0 = time.perf_counter()
        o = self.options
        timeout = o.timeout if timeout is None else timeout
        call = _GreenCall(service, aggregator, self._k, self)
        self.counters["calls"] += 1
        flight = None
        try:
            if self.closed:
                raise CommunicationError("client is closed")
            deadline = None if timeout is None else time.monotonic() + timeout
            buffers: list = []
            tree_args = codec.encode(list(args), buffers, read_file)
            tree_kwargs = codec.encode(kwargs, buffers, read_file) if kwargs else {}
            if buffers:
                size = sum(len(memoryview(b).cast("B")) if not isinstance(b, bytes) else len(b) for b in buffers)
                if size > o.max_message_size:
                    raise MessageTooLarge(f"arguments of {service} are {size} bytes; the maximum message "
                                          f"size is {o.max_message_size}")
            candidates = () if server is None else (self.resolve(server),)
            header = m.make(_CALL, "", service=service, args=tree_args, kwargs=tree_kwargs, user=self.user,
                            optional=False, ack_ms=self._policy.ack_ms)
            machine = CallMachine(service, candidates, policy=self._policy, deadline=deadline, new_id=new_id,
                                  discover=server is None)
            flight = self._driver.launch(machine, header, buffers or (), call)
            outcome = self._driver.wait(flight)
        except GridRPCError as exc:
            self._end(call, flight, None)
            self._record("call" if server is None else "bound", service, t0, error=type(exc).__name__,
                         discover_ms=self._discover_ms(call, t0))
            raise
        except BaseException:
            self._end(call, flight, None)
            raise
        self._end(call, flight, outcome)
        kind = "call" if server is None else "bound"
        if type(outcome) is Done:
            value, size = outcome.value
            self._record(kind, service, t0, size=size, server=outcome.server, discover_ms=self._discover_ms(call, t0))
            return value
        exc = exception_for(outcome.error)
        self._record(kind, service, t0, error=type(exc).__name__, discover_ms=self._discover_ms(call, t0))
        raise exc

    def _end(self, call: _GreenCall, flight: Flight | None, outcome) -> None:
        chosen = call.chosen
        if chosen is not None:
            call.chosen = None
            self._reuse.ended(chosen, failed=server_failed(flight.machine if flight else None, outcome),
                              now=self._driver.clock())
        if flight is not None:
            flight.context = None

    @staticmethod
    def _discover_ms(call: _GreenCall, t0: float) -> float:
        """The part of the call spent before its first CALL left, when it asked the MA (0: it did not)."""
        if call.asked_at is None:
            return 0.0
        return ((call.sent_at if call.sent_at is not None else time.perf_counter()) - t0) * 1000

    def bind(self, service: str, k: int = 1, *, pick: int = 0) -> "GreenHandle":
        """Discover ``service`` once and return a handle bound to the
        ``pick``-th best server (modulo the number found)."""
        servers = self.discover(service, max(k, pick + 1))
        if not servers:
            raise NoServerAvailable(f"no server available for {service!r}")
        return GreenHandle(self, service, servers[pick % len(servers)])

    def handle(self, service: str, server: str | ServerInfo | None = None) -> "GreenHandle":
        return GreenHandle(self, service, server)

    def _sed(self, address: str) -> GreenSocket:
        s = self._seds.get(address)
        if s is None or s.closed:
            if self.closed:
                raise CommunicationError("client is closed")
            on_message = self._driver.on_message
            s = GreenSocket(address, lambda frames: on_message(address, frames), f"client->{address}")
            self._seds[address] = s
        return s

    # -- records ----------------------------------------------------------
    def _record(self, kind: str, service: str, t0: float, **kw) -> None:
        rec = Record(kind, service, (time.perf_counter() - t0) * 1000, **kw)
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

