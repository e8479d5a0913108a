"""The asyncio client.

A call: discover candidates through the MA (or use the bound server), then
hand them to a call machine (:mod:`gridrpc.core.call`) driven by
:class:`~gridrpc.client.driver.AsyncCallDriver`: CALL straight to the first
SeD, ACCEPTED within ``ack_timeout`` (else the next candidate), pings every
``ping_interval`` while it runs, failover or
:class:`~gridrpc.errors.CommunicationError` when a SeD stops answering for
``ping_timeout`` (or the ``patience`` it announced), CANCEL to every server
given up on. This module owns the sockets and the MA requests; no protocol
rule lives here.
"""
from __future__ import annotations

import asyncio
import functools
import getpass
import logging
import os
from typing import Any

from ..core import codec
from ..core import messages as m
from ..core.call import CallMachine, Done, SendCall
from ..core.messages import MsgType
from ..errors import (CallCancelled, CommunicationError, MessageTooLarge, NoServerAvailable, ProtocolError,
                      ServiceNotFound, error_from_wire)
from ..files import FileSink, read_file
from ..transport.channel import Channel, connect_dealer
from .call import Call, ServerInfo
from .driver import AsyncCallDriver, Flight, exception_for
from .ids import new_id
from .options import ClientOptions, option_view

log = logging.getLogger(__name__)


def default_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        return os.environ.get("USER", "anonymous")


class AsyncClient:
    """``async with gridrpc.AsyncClient(ma, user="alice") as client: await client.call(...)``.

    Keyword options: the fields of :class:`~gridrpc.client.options.ClientOptions`
    (or ``options=ClientOptions(...)`` plus overrides); an unknown one is a TypeError.
    """

    timeout = option_view("timeout")
    discovery_timeout = option_view("discovery_timeout")
    ack_timeout = option_view("ack_timeout")
    ping_interval = option_view("ping_interval")
    ping_timeout = option_view("ping_timeout")
    failover = option_view("failover")
    max_candidates = option_view("max_candidates")
    max_message_size = option_view("max_message_size")
    aggregator = option_view("aggregator")
    discovery_budget = property(lambda self: self.options.budget, doc="discovery budget sent to the agents, s")

    def __init__(self, master_agent: str | None = None, *, options: ClientOptions | None = None,
                 **kwargs: Any) -> None:
        self.options = ClientOptions.build(type(self).__name__, options, **kwargs)
        self.master_agent = master_agent
        self.user = self.options.user or default_user()
        self.sink = FileSink(self.options.download_dir)
        self._policy = self.options.policy()
        self._ma: Channel | None = None
        self._seds: dict[str, Channel] = {}
        self._pending: dict[str, asyncio.Future] = {}
        self._server_addresses: dict[str, str] = {}
        self._driver: AsyncCallDriver | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self._tasks: set[asyncio.Task] = set()     # submitted calls still running

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> "AsyncClient":
        self.loop = asyncio.get_running_loop()
        self._driver = AsyncCallDriver(self.loop, self._send, new_id=new_id, decode=self._decode,
                                       on_attempt=_on_attempt)
        if self.master_agent:
            self._ma = Channel(connect_dealer(self.master_agent), self._on_ma, name="client->MA")
        return self

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(CommunicationError("client closed"))
        if self._driver is not None:
            self._driver.abort_all("client closed")
        if self._tasks:          # let submitted calls end (they fail: client closed), retrieved here
            tasks = list(self._tasks)
            done, pending = await asyncio.wait(tasks, timeout=2.0)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if getattr(self, "_data_client", None) is not None:
            self._data_client.close()
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
        o = self.options
        h = m.make(MsgType.DISCOVER, new_id(), service=service, k=int(max_servers), user=self.user,
                   aggregator=aggregator if aggregator is not None else o.aggregator,
                   budget_ms=o.budget * 1000, optional=bool(optional),
                   args=[codec.light_description(a) for a in args])
        mt, r = await self._ma_request(h, o.discovery_timeout)
        if mt is MsgType.ERROR:
            raise error_from_wire(r["error"])
        servers = [ServerInfo(name=s["name"], address=s["address"], estimation=s.get("estimation") or {})
                   for s in r.get("servers", []) if isinstance(s, dict) and "name" in s and "address" in s]
        for s in servers:
            self._server_addresses[s.name] = s.address
        return servers

    async def tree(self) -> list[dict]:
        """Every element of the tree as the MA sees it (like GET /api/tree)."""
        mt, r = await self._ma_request(m.make(MsgType.SERVICES, new_id(), tree=True), self.discovery_timeout)
        if mt is MsgType.ERROR:
            raise error_from_wire(r["error"])
        return r.get("elements") or []

    async def services(self) -> dict[str, dict]:
        """The catalogue: service -> {doc, params, servers}."""
        mt, r = await self._ma_request(m.make(MsgType.SERVICES, new_id()), self.discovery_timeout)
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
                   timeout: float | None = None, aggregator: Any = None, keep_result: Any = False, **kwargs):
        """Call and wait for the result (no Task per call: the fast path).
        ``keep_result``: True or a data mode: the result stays on the SeD and
        a :class:`~gridrpc.client.data.DataRef` is returned."""
        if self.closed:
            raise CommunicationError("client is closed")
        call = Call(self, service, self.loop)
        call.optional = bool(optional)
        return await self._run(call, args, kwargs, server, timeout if timeout is not None else self.timeout,
                               aggregator, keep_result)

    async def submit(self, service: str, *args, optional: bool = False, server: str | ServerInfo | None = None,
                     timeout: float | None = None, aggregator: Any = None, keep_result: Any = False,
                     **kwargs) -> Call:
        """Start a call; returns its :class:`Call` at once (``await call`` for the result)."""
        return self.submit_nowait(service, *args, optional=optional, server=server, timeout=timeout,
                                  aggregator=aggregator, keep_result=keep_result, **kwargs)

    def submit_nowait(self, service: str, *args, optional: bool = False, server: str | ServerInfo | None = None,
                      timeout: float | None = None, aggregator: Any = None, keep_result: Any = False,
                      **kwargs) -> Call:
        """Like :meth:`submit`, as a plain function (call it from the client's loop)."""
        if self.closed:
            raise CommunicationError("client is closed")
        call = Call(self, service, self.loop)
        call.optional = bool(optional)
        if keep_result:
            call._keep = _data().keep_spec(keep_result)
        task = self.loop.create_task(self._run(call, args, kwargs, server,
                                               timeout if timeout is not None else self.timeout, aggregator,
                                               keep_result))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        call._bind(task)
        return call

    def handle(self, service: str, server: str | ServerInfo | None = None) -> "AsyncHandle":
        return AsyncHandle(self, service, server)

    async def run_optional(self, service: str, mandatory=(), optional=(), deadline: float = 60.0,
                           max_servers: int | None = None, **kw):
        """Mandatory calls plus as many optional ones as fit before ``deadline``
        (seconds from now); see :func:`gridrpc.client.optional.run_optional`."""
        from .optional import run_optional
        return await run_optional(self, service, mandatory, optional, deadline, max_servers, **kw)

    async def _run(self, call: Call, args: tuple, kwargs: dict, server, timeout, aggregator, keep_result=False):
        keep = light = None
        if keep_result or (args or kwargs) and _data().has_data(args, kwargs):
            d = _data()          # references and pending calls as arguments (gridrpc.client.data)
            keep = getattr(call, "_keep", None) or d.keep_spec(keep_result)
            call._keep = keep
            args, kwargs, refs = await d.prepare_args(self, args, kwargs)
            if refs:
                server = server or d.sticky_holder(refs)
                light = list(args) + list(kwargs.values())
                if aggregator is None and self.options.aggregator in (None, "default"):
                    aggregator = "locality"
        buffers: list = []
        tree_args = codec.encode(list(args), buffers, read_file)
        tree_kwargs = codec.encode(dict(kwargs), buffers, read_file)
        size = sum(len(memoryview(b).cast("B")) if not isinstance(b, bytes) else len(b) for b in buffers)
        if size > self.options.max_message_size:
            raise MessageTooLarge(f"arguments of {call.service} are {size} bytes; the maximum message "
                                  f"size is {self.options.max_message_size} (Client(max_message_size=...))")
        deadline = None if timeout is None else self.loop.time() + timeout
        candidates = await self._candidates(call, server, aggregator, light or ())
        if self.closed:
            raise CommunicationError("client is closed")
        header = m.make(MsgType.CALL, "", service=call.service, args=tree_args, kwargs=tree_kwargs,
                        user=self.user, optional=call.optional)
        if keep is not None:
            header["keep"] = keep
        machine = CallMachine(call.service, candidates, policy=self._policy, deadline=deadline, new_id=new_id)
        flight = call._flight = self._driver.launch(machine, header, buffers, call)
        try:
            outcome = await flight.waiter
        except asyncio.CancelledError:
            self._driver.abandon(flight)        # CANCEL to the server
            raise
        if type(outcome) is Done:
            call.timing = outcome.timing
            return outcome.value if keep is None else _data().to_ref(self, outcome.value)
        exc = exception_for(outcome.error)
        if isinstance(exc, CallCancelled):
            exc.timing = call.timing = outcome.error.timing      # the server's, when it sent them
        else:
            call.timing = {}
        raise exc

    async def _candidates(self, call: Call, server, aggregator, args=()) -> list[ServerInfo]:
        if isinstance(server, ServerInfo):
            return [server]
        if isinstance(server, str):
            return [await self.resolve(server)]
        return await self.discover(call.service, self.max_candidates if self.failover else 1,
                                   aggregator=aggregator, args=args, optional=call.optional)

    # -- data held on SeDs (gridrpc.client.data) ----------------------------
    @property
    def data(self):
        if getattr(self, "_data_client", None) is None:
            self._data_client = _data().DataClient(self)
        return self._data_client

    async def put(self, value, *, server: str | ServerInfo | None = None, service: str | None = None,
                  mode: str = "persistent", timeout: float | None = None):
        """Store ``value`` on a SeD (``server``, else one offering ``service``,
        else the tree's least loaded in data); returns a ``DataRef``."""
        return await self.data.put(value, server=server, service=service, mode=mode, timeout=timeout)

    async def get(self, ref, timeout: float | None = None):
        return await ref.aget(timeout)

    async def free(self, ref) -> None:
        await ref.afree()

    async def _cancel_remote(self, call: Call) -> None:
        """Cancel ``call`` on its server; returns when the server confirmed (or
        after ``ack_timeout``). Nothing to do before the call is sent."""
        flight: Flight | None = getattr(call, "_flight", None)
        if flight is None or flight.machine.finished:
            return
        self._driver.cancel(flight)
        await asyncio.shield(flight.waiter)

    # -- SeD sockets ------------------------------------------------------
    def _channel(self, address: str) -> Channel:
        ch = self._seds.get(address)
        if ch is None or ch.closed:
            if self.closed:
                raise CommunicationError("client is closed")
            ch = Channel(connect_dealer(address), functools.partial(self._driver.on_message, address),
                         name=f"client->{address}")
            self._seds[address] = ch
        return ch

    def _send(self, address: str, frames: list) -> None:
        self._channel(address).send(frames)

    def _decode(self, header: dict, frames: list):
        return codec.decode(header.get("value"), [f.buffer for f in frames[1:]], self.sink)


def _data():
    from . import data
    return data


def _on_attempt(flight: Flight, a: SendCall) -> None:
    call = flight.context
    if call.id != a.id:
        call.attempts.append(a.id)
    call.id, call.server, call.address = a.id, a.server, a.address


class AsyncHandle:
    """A function handle: a service, optionally bound to one server (no
    discovery per call)."""

    def __init__(self, client: AsyncClient, service: str, server=None, optional: bool = False) -> None:
        self.client, self.service, self.server, self.optional = client, service, server, optional

    async def __call__(self, *args, **kwargs):
        return await self.client.call(self.service, *args, server=self.server, optional=self.optional, **kwargs)

    async def submit(self, *args, **kwargs) -> Call:
        return self.client.submit_nowait(self.service, *args, server=self.server, optional=self.optional, **kwargs)
