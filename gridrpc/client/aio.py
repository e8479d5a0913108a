"""The asyncio client.

A call: discover candidates through the MA (or use the bound server), send
the CALL straight to the first SeD, wait for its ACCEPTED within
``ack_timeout`` (else try the next candidate), then wait for the RESULT while
pinging the SeD every ``ping_interval``: a SeD that stops answering for
``ping_timeout`` fails the call over to the next candidate (``failover``) or
raises :class:`~gridrpc.errors.CommunicationError`.
"""
from __future__ import annotations

import asyncio
import getpass
import itertools
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..core import codec
from ..core import messages as m
from ..core.messages import MsgType
from ..errors import (CallCancelled, CommunicationError, GridRPCError, MessageTooLarge,
                      NoServerAvailable, ProtocolError, ServiceNotFound, Timeout, error_from_wire)
from ..files import FileSink, read_file
from ..transport.channel import Channel, connect_dealer
from .call import Call, ServerInfo

log = logging.getLogger(__name__)


def default_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        return os.environ.get("USER", "anonymous")


@dataclass
class _Attempt:
    id: str
    address: str
    server: str
    accepted: asyncio.Future
    result: asyncio.Future
    last_pong: float = 0.0
    sent: float = field(default_factory=time.monotonic)
    patience: float = 0.0       # silence the SeD asked us to tolerate (ACCEPTED 'patience', batch SeDs)


class AsyncClient:
    def __init__(self, master_agent: str | None = None, *, user: str | None = None,
                 timeout: float | None = None, discovery_timeout: float = 5.0,
                 discovery_budget: float | None = None, ack_timeout: float = 5.0,
                 ping_interval: float = 1.0, ping_timeout: float = 4.0, failover: bool = True,
                 max_candidates: int = 3, max_message_size: int = 512 * 1024 * 1024,
                 aggregator: Any = None, download_dir: str | None = None) -> None:
        self.master_agent = master_agent
        self.user = user or default_user()
        self.timeout = timeout
        self.discovery_timeout = discovery_timeout
        self.discovery_budget = discovery_budget if discovery_budget is not None else max(0.05, discovery_timeout * 0.6)
        self.ack_timeout = ack_timeout
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.failover = failover
        self.max_candidates = max_candidates
        self.max_message_size = max_message_size
        self.aggregator = aggregator
        self.sink = FileSink(download_dir)
        self._ma: Channel | None = None
        self._seds: dict[str, Channel] = {}
        self._pending: dict[str, asyncio.Future] = {}
        self._attempts: dict[str, _Attempt] = {}
        self._server_addresses: dict[str, str] = {}
        self._ping_task: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> "AsyncClient":
        self.loop = asyncio.get_running_loop()
        if self.master_agent:
            self._ma = Channel(connect_dealer(self.master_agent), self._on_ma, name="client->MA")
        self._ping_task = self.loop.create_task(self._pinger())
        return self

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._ping_task:
            self._ping_task.cancel()
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(CommunicationError("client closed"))
        for a in list(self._attempts.values()):
            for f in (a.accepted, a.result):
                if not f.done():
                    f.set_exception(CommunicationError("client closed"))
        if self._ma:
            self._ma.close()
        for ch in self._seds.values():
            ch.close()

    # -- MA requests ------------------------------------------------------
    def _on_ma(self, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            log.warning("bad message from the MA: %s", exc)
            return
        fut = self._pending.pop(h["id"], None)
        if fut is not None and not fut.done():
            fut.set_result((mt, h))

    async def _ma_request(self, header: dict, timeout: float) -> tuple[MsgType, dict]:
        if self._ma is None:
            raise ServiceNotFound("this client has no master agent: bind handles to servers by address")
        fut = self.loop.create_future()
        self._pending[header["id"]] = fut
        try:
            self._ma.send([m.dumps(header)])
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise CommunicationError(f"the master agent at {self.master_agent} did not answer "
                                     f"within {timeout}s") from None
        finally:
            self._pending.pop(header["id"], None)

    async def discover(self, service: str, max_servers: int = 10, *, aggregator: Any = None,
                       args: tuple = (), optional: bool = False) -> list[ServerInfo]:
        """Ranked servers (best first) offering ``service``: min(max_servers, available)."""
        h = m.make(MsgType.DISCOVER, _new_id(), service=service, k=int(max_servers), user=self.user,
                   aggregator=aggregator if aggregator is not None else self.aggregator,
                   budget_ms=self.discovery_budget * 1000, optional=optional,
                   args=[codec.light_description(a) for a in args])
        mt, r = await self._ma_request(h, self.discovery_timeout)
        if mt is MsgType.ERROR:
            raise error_from_wire(r["error"])
        servers = [ServerInfo(name=s["name"], address=s["address"], estimation=s.get("estimation") or {})
                   for s in r.get("servers", []) if isinstance(s, dict) and "name" in s and "address" in s]
        for s in servers:
            self._server_addresses[s.name] = s.address
        return servers

    async def tree(self) -> list[dict]:
        """Every element of the tree as the MA sees it (like GET /api/tree)."""
        mt, r = await self._ma_request(m.make(MsgType.SERVICES, _new_id(), tree=True), self.discovery_timeout)
        if mt is MsgType.ERROR:
            raise error_from_wire(r["error"])
        return r.get("elements") or []

    async def services(self) -> dict[str, dict]:
        """The catalogue: service -> {doc, params, servers}."""
        mt, r = await self._ma_request(m.make(MsgType.SERVICES, _new_id()), self.discovery_timeout)
        if mt is MsgType.ERROR:
            raise error_from_wire(r["error"])
        self._server_addresses.update({k: v for k, v in (r.get("servers") or {}).items() if v})
        return r["services"]

    async def resolve(self, server: str) -> ServerInfo:
        """A SeD by name (or ``tcp://host:port#name`` / ``tcp://host:port``)."""
        if "://" in server:
            addr, _, name = server.partition("#")
            return ServerInfo(name=name or "", address=addr)
        if server not in self._server_addresses:
            await self.services()
        if server not in self._server_addresses:
            raise NoServerAvailable(f"no server named {server!r} in the tree")
        return ServerInfo(name=server, address=self._server_addresses[server])

    # -- calls ------------------------------------------------------------
    async def call(self, service: str, *args, optional: bool = False, server: str | ServerInfo | None = None,
                   timeout: float | None = None, aggregator: Any = None, **kwargs):
        """Call and wait for the result (no Task or Future per call: the fast path)."""
        if self.closed:
            raise CommunicationError("client is closed")
        call = Call(self, service, self.loop)
        call.optional = optional
        return await self._run(call, args, kwargs, server, timeout if timeout is not None else self.timeout,
                               aggregator)

    async def submit(self, service: str, *args, optional: bool = False, server: str | ServerInfo | None = None,
                     timeout: float | None = None, aggregator: Any = None, **kwargs) -> Call:
        """Start a call; returns its :class:`Call` at once (``await call`` for the result)."""
        return self.submit_nowait(service, *args, optional=optional, server=server, timeout=timeout,
                                  aggregator=aggregator, **kwargs)

    def submit_nowait(self, service: str, *args, optional: bool = False, server: str | ServerInfo | None = None,
                      timeout: float | None = None, aggregator: Any = None, **kwargs) -> Call:
        """Like :meth:`submit`, as a plain function (call it from the client's loop)."""
        if self.closed:
            raise CommunicationError("client is closed")
        call = Call(self, service, self.loop)
        call.optional = optional
        call._bind(self.loop.create_task(self._run(call, args, kwargs, server,
                                                   timeout if timeout is not None else self.timeout,
                                                   aggregator)))
        return call

    def handle(self, service: str, server: str | ServerInfo | None = None) -> "AsyncHandle":
        return AsyncHandle(self, service, server)

    async def run_optional(self, service: str, mandatory=(), optional=(), deadline: float = 60.0,
                           max_servers: int | None = None, **kw):
        """Mandatory calls plus as many optional ones as fit before ``deadline``
        (seconds from now); see :func:`gridrpc.client.optional.run_optional`."""
        from .optional import run_optional
        return await run_optional(self, service, mandatory, optional, deadline, max_servers, **kw)

    async def _run(self, call: Call, args: tuple, kwargs: dict, server, timeout, aggregator):
        buffers: list = []
        tree_args = codec.encode(list(args), buffers, read_file)
        tree_kwargs = codec.encode(dict(kwargs), buffers, read_file)
        size = sum(len(memoryview(b).cast("B")) if not isinstance(b, bytes) else len(b) for b in buffers)
        if size > self.max_message_size:
            raise MessageTooLarge(f"arguments of {call.service} are {size} bytes; the maximum message "
                                  f"size is {self.max_message_size} (Client(max_message_size=...))")
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return await self._dispatch(call, tree_args, tree_kwargs, buffers, server, deadline, aggregator)
        except asyncio.CancelledError:
            if call.id and call.id in self._attempts and not call._cancel_requested:
                await self._cancel_remote(call)
            raise

    async def _candidates(self, call: Call, server, aggregator, args) -> list[ServerInfo]:
        if isinstance(server, ServerInfo):
            return [server]
        if isinstance(server, str):
            return [await self.resolve(server)]
        return await self.discover(call.service, self.max_candidates if self.failover else 1,
                                   aggregator=aggregator, args=(), optional=call.optional)

    async def _dispatch(self, call: Call, tree_args, tree_kwargs, buffers, server, deadline, aggregator):
        candidates = await self._candidates(call, server, aggregator, ())
        if not candidates:
            raise NoServerAvailable(f"no server available for {call.service!r}")
        errors: list[str] = []
        for i, srv in enumerate(candidates):
            last = i == len(candidates) - 1
            attempt = self._send_call(call, srv, tree_args, tree_kwargs, buffers)
            try:
                try:
                    await asyncio.wait_for(asyncio.shield(attempt.accepted),
                                           _remaining(deadline, self.ack_timeout))
                except asyncio.TimeoutError:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise Timeout(f"call to {call.service} timed out before {srv.name} accepted it")
                    errors.append(f"{srv.name}: no answer within {self.ack_timeout}s")
                    self._cancel_attempt(attempt)
                    continue
                except CommunicationError as exc:
                    errors.append(f"{srv.name}: {exc}")
                    continue
                except (NoServerAvailable, ServiceNotFound) as exc:
                    if last:
                        raise
                    errors.append(f"{srv.name}: {exc}")
                    continue
                try:
                    value, _timing = await asyncio.wait_for(asyncio.shield(attempt.result),
                                                            _remaining(deadline, None))
                    return value
                except asyncio.TimeoutError:
                    self._cancel_attempt(attempt)
                    raise Timeout(f"call to {call.service} on {srv.name} timed out") from None
                except CommunicationError as exc:
                    if not self.failover or last:
                        raise
                    log.warning("call %s: %s failed (%s); trying %s", attempt.id, srv.name, exc,
                                candidates[i + 1].name)
                    errors.append(f"{srv.name}: {exc}")
                    continue
            finally:
                self._attempts.pop(attempt.id, None)
        raise CommunicationError(f"no candidate server could run {call.service}: " + "; ".join(errors))

    def _channel(self, address: str) -> Channel:
        ch = self._seds.get(address)
        if ch is None or ch.closed:
            ch = Channel(connect_dealer(address), self._on_sed, name=f"client->{address}")
            self._seds[address] = ch
        return ch

    def _send_call(self, call: Call, srv: ServerInfo, tree_args, tree_kwargs, buffers) -> _Attempt:
        aid = _new_id()
        a = _Attempt(id=aid, address=srv.address, server=srv.name, accepted=self.loop.create_future(),
                     result=self.loop.create_future(), last_pong=time.monotonic())
        self._attempts[aid] = a
        call.id, call.server, call.address = aid, srv.name, srv.address
        call.attempts.append(aid)
        header = m.make(MsgType.CALL, aid, service=call.service, args=tree_args, kwargs=tree_kwargs,
                        user=self.user, optional=call.optional)
        if srv.name:
            header["sed"] = srv.name
        try:
            self._channel(srv.address).send([m.dumps(header), *buffers])
        except GridRPCError as exc:
            a.accepted.set_exception(CommunicationError(str(exc)))
            a.accepted.exception()
        a.result.add_done_callback(lambda f, call=call: _store_timing(call, f))
        return a

    def _on_sed(self, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            log.warning("bad message from a SeD: %s", exc)
            return
        if mt is MsgType.PONG:
            now = time.monotonic()
            for cid, state in (h.get("calls") or {}).items():
                a = self._attempts.get(cid)
                if a is None:
                    continue
                if state == "unknown" and a.accepted.done():
                    _fail(a, CommunicationError(f"{a.server} lost call {cid} (restarted?)"))
                else:
                    a.last_pong = now
            return
        a = self._attempts.get(h["id"])
        if a is None or mt is MsgType.CANCELLED:
            fut = self._pending.pop(h["id"], None)   # cancel acks
            if fut is not None and not fut.done():
                fut.set_result((mt, h))
            return
        a.last_pong = time.monotonic()
        if mt is MsgType.ACCEPTED:
            patience = h.get("patience")
            if isinstance(patience, (int, float)) and not isinstance(patience, bool) and patience > 0:
                a.patience = min(float(patience), 3600.0)   # e.g. a batch SeD restarting
            if not a.accepted.done():
                a.accepted.set_result(h.get("sed"))
        elif mt is MsgType.RESULT:
            try:
                value = codec.decode(h.get("value"), [f.buffer for f in frames[1:]], self.sink)
            except ProtocolError as exc:
                _fail(a, exc)
                return
            if not a.accepted.done():
                a.accepted.set_result(h.get("server"))
            if not a.result.done():
                a.result.set_result((value, h.get("timing") or {}))
        elif mt is MsgType.ERROR:
            err = error_from_wire(h["error"], server=h.get("server") or a.server)
            if isinstance(err, CallCancelled):
                err.timing = h.get("timing") or {}
            _fail(a, err)

    async def _cancel_remote(self, call: Call) -> None:
        a = self._attempts.get(call.id or "")
        if a is None:
            return
        fut = self.loop.create_future()
        self._pending[a.id] = fut
        self._cancel_attempt(a)
        try:
            await asyncio.wait_for(fut, self.ack_timeout)
        except (asyncio.TimeoutError, GridRPCError):
            log.info("cancel of %s: %s did not confirm", a.id, a.server)
        finally:
            self._pending.pop(a.id, None)

    def _cancel_attempt(self, a: _Attempt) -> None:
        h = m.make(MsgType.CANCEL, a.id)
        if a.server:
            h["sed"] = a.server
        try:
            self._channel(a.address).send([m.dumps(h)])
        except GridRPCError:
            pass

    async def _pinger(self) -> None:
        while True:
            await asyncio.sleep(self.ping_interval)
            now = time.monotonic()
            by_addr: dict[str, list[_Attempt]] = {}
            for a in list(self._attempts.values()):
                if a.result.done() or not a.accepted.done():
                    continue
                if now - a.last_pong > max(self.ping_timeout, a.patience):
                    _fail(a, CommunicationError(f"server {a.server} ({a.address}) stopped answering "
                                                f"for {now - a.last_pong:.1f}s"))
                elif now - a.last_pong >= self.ping_interval * 0.9:
                    by_addr.setdefault(a.address, []).append(a)
            for addr, attempts in by_addr.items():
                try:
                    self._channel(addr).send([m.dumps(m.make(MsgType.PING, _new_id(),
                                                             ids=[a.id for a in attempts]))])
                except GridRPCError:
                    pass


class AsyncHandle:
    """A function handle: a service, optionally bound to one server (no
    discovery per call)."""

    def __init__(self, client: AsyncClient, service: str, server=None, optional: bool = False) -> None:
        self.client, self.service, self.server, self.optional = client, service, server, optional

    async def __call__(self, *args, **kwargs):
        return await self.client.call(self.service, *args, server=self.server, optional=self.optional, **kwargs)

    async def submit(self, *args, **kwargs) -> Call:
        return self.client.submit_nowait(self.service, *args, server=self.server, optional=self.optional, **kwargs)


def _fail(a: _Attempt, exc: BaseException) -> None:
    for f in (a.accepted, a.result):
        if not f.done():
            f.set_exception(exc)
            f.exception()   # mark retrieved: the other future may be the one awaited


def _store_timing(call: Call, fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is None:
        call.timing = fut.result()[1]
    elif not fut.cancelled():
        call.timing = getattr(fut.exception(), "timing", {}) or {}


def _remaining(deadline: float | None, cap: float | None) -> float | None:
    if deadline is None:
        return cap
    left = max(0.0, deadline - time.monotonic())
    return left if cap is None else min(left, cap)


_ID_PREFIX = uuid.uuid4().hex[:16]       # random per process: ids stay unique across clients
_ID_COUNTER = itertools.count(1)


def _reseed_ids() -> None:
    global _ID_PREFIX, _ID_COUNTER       # a forked child must not reuse its parent's ids
    _ID_PREFIX, _ID_COUNTER = uuid.uuid4().hex[:16], itertools.count(1)


os.register_at_fork(after_in_child=_reseed_ids)


def _new_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):x}"
