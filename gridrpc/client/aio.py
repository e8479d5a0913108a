"""The asyncio client.

A call: discover candidates through the MA (or use the bound server), then
hand them to a call machine (:mod:`gridrpc.core.client_call.machine`) driven by
:class:`~gridrpc.client.driver.AsyncCallDriver`: CALL straight to the first
SeD, ACCEPTED within ``ack_timeout`` (else the next candidate), pings every
``ping_interval`` while it runs, failover or
:class:`~gridrpc.errors.CommunicationError` when a SeD stops answering for
``ping_timeout`` (or the ``patience`` it announced), CANCEL to every server
given up on. This module owns the client's lifecycle, discovery for calls
and the SeD sockets, :mod:`gridrpc.client.submit` the calls (with or
without a task) and :mod:`gridrpc.client.ma_requests` the requests to the
master agents (discovery, catalogue, tree); no protocol rule lives here.
"""
from __future__ import annotations

import asyncio
import functools
import getpass
import logging
import os
from typing import Any

from ..core import codec
from ..address import parse_addresses
from ..core.client_call.machine import Discover, Discovered, DiscoveryFailed, SendCall
from ..errors import CommunicationError, GridRPCError, kind_of
from ..files import FileSink
from ..transport.channel import Channel, connect_dealer
from ..transport.handshake import HandshakeWatch
from .futures import Call, ServerInfo
from .driver import AsyncCallDriver, Flight
from .ids import new_id
from .ma_requests import MasterAgentRequests
from .options import ClientOptions, OptionViews
from .reuse import ReusedAnswers, answer_key, ask_again, ask_for
from .submit import SubmitMixin

log = logging.getLogger(__name__)


def default_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        return os.environ.get("USER", "anonymous")


class AsyncClient(SubmitMixin, OptionViews, MasterAgentRequests):
    """``async with gridrpc.AsyncClient(ma, user="alice") as client: await client.call(...)``.

    Keyword options: the fields of :class:`~gridrpc.client.options.ClientOptions`
    (or ``options=ClientOptions(...)`` plus overrides); an unknown one is a TypeError.
    """

    discovery_budget = property(lambda self: self.options.budget, doc="discovery budget sent to the agents, s")
    secure = property(lambda self: self._security is not None, doc="whether this client speaks CURVE to the tree")

    def __init__(self, master_agent: str | list[str] | None = None, *, options: ClientOptions | None = None,
                 **kwargs: Any) -> None:
        self.options = ClientOptions.build(type(self).__name__, options, **kwargs)
        if master_agent is None and os.environ.get("GRIDRPC_MA"):
            master_agent = os.environ["GRIDRPC_MA"]
        several = isinstance(master_agent, (list, tuple)) or (isinstance(master_agent, str) and "," in master_agent)
        #: every master agent, in order of preference (several: active-active, see docs/reliability.md)
        self.master_agents: list[str] = (parse_addresses(master_agent, what="master_agent") if several
                                         else [master_agent] if master_agent else [])
        self.master_agent = self.master_agents[0] if self.master_agents else None
        self._mas: list[Channel] = []
        self._ma_watches: list[HandshakeWatch] = []   # each MA link's handshake outcome (key problems)
        self._ma_current = 0
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
        self._tasks: set[asyncio.Future] = set()   # submitted calls still running (their task or future)
        # what the driver calls when a submitted call without a task ends (submit.py), made once
        self._on_direct_end = self._direct_end
        self._security, self._ma_public = client_security(self.options, self.user, len(self.master_agents))
        if self._security is not None:
            self.user = self._security.name         # the SeDs account calls to the key's user
        self._server_keys: dict[str, bytes] = {}    # SeD address -> public key (from the MA's answers)
        #: under CURVE, messages to and from a SeD take a bulk session once one is open
        #: (gridrpc.transport.bulk: AES-256-GCM on a second connection, keys given over CURVE)
        self._bulk = None
        if self._security is not None:
            from ..transport.bulk_client import BulkLinks
            self._bulk = BulkLinks(self._send_curve, self._on_bulk)
        #: view answers kept for calls (``reuse_discovery``; gridrpc.client.reuse)
        self._reuse = ReusedAnswers(self.options.reuse_discovery) if self.options.reuse_discovery else None
        self._joining: dict[tuple, list] = {}  # reuse key -> [(flight, Discover)] waiting for the same discovery

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> "AsyncClient":
        self.loop = asyncio.get_running_loop()
        self._driver = AsyncCallDriver(self.loop, self._send, new_id=new_id, decode=self._decode,
                                       on_attempt=_on_attempt, on_discover=self._on_discover)
        for i, addr in enumerate(self.master_agents):
            opts = (self._security.client_options(self._ma_public[i if len(self._ma_public) > 1 else 0])
                    if self._security is not None else None)
            watch: list[HandshakeWatch] = []
            sock = connect_dealer(addr, options=opts, before_connect=lambda s: watch.append(HandshakeWatch(s)))
            self._ma_watches.append(watch[0])
            self._mas.append(Channel(sock, functools.partial(self._on_ma, i),
                                     name=f"client->MA{i}" if i else "client->MA"))
        self._ma = self._mas[0] if self._mas else None
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
            self._driver.flush()        # the CANCELs of those calls leave before the sockets close
        if self._tasks:          # let submitted calls end (they fail: client closed), retrieved here
            tasks = list(self._tasks)
            done, pending = await asyncio.wait(tasks, timeout=2.0)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if getattr(self, "_data_client", None) is not None:
            self._data_client.close()
        for w in self._ma_watches:
            w.close()
        for ch in self._mas:
            ch.close()
        if self._bulk is not None:
            self._bulk.close()
        for ch in self._seds.values():
            ch.close()

    def busy(self) -> bool:
        """Whether anything of this client is in flight: a call (or its
        discovery, or a message of the driver not sent yet), a request to a
        master agent, a task, a data request."""
        d = self._driver
        data = getattr(self, "_data_client", None)
        return bool(self._pending or self._tasks or (d is not None and d.busy())
                    or (data is not None and data.in_flight()))

    # -- calls (the rest: gridrpc.client.submit) -------------------------------
    def handle(self, service: str, server: str | ServerInfo | None = None) -> "AsyncHandle":
        return AsyncHandle(self, service, server)

    async def run_optional(self, service: str, mandatory=(), optional=(), deadline: float = 60.0,
                           max_servers: int | None = None, **kw):
        """Mandatory calls plus as many optional ones as fit before ``deadline``
        (seconds from now); see :func:`gridrpc.client.optional.run_optional`."""
        from .optional import run_optional
        return await run_optional(self, service, mandatory, optional, deadline, max_servers, **kw)

    async def _candidates(self, call: Call, server, aggregator, args=()) -> list[ServerInfo]:
        if isinstance(server, (ServerInfo, str)):
            info = server if isinstance(server, ServerInfo) else await self.resolve(server)
            if self._security is not None and info.address not in self._server_keys:
                await self.dealer_options(info.address)     # under CURVE its key comes from the MA
            return [info]
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
        """The value of ``ref``, fetched by this client (with its identity)."""
        if ref._client is self:
            return await ref.aget(timeout)
        return await self.data.get(ref, timeout)

    async def free(self, ref) -> None:
        await self.data.free(ref)

    def _on_discover(self, flight: Flight, a: Discover) -> Discovered | None:
        """The machine asks for candidates: a view answer kept from the last
        ``reuse_discovery`` seconds at once; else, when a call of the same
        key is already discovering, its answer (joined); else discover in a
        task and feed the answer back."""
        reuse, key = self._reuse, None
        if reuse is not None and not self.closed:
            call = flight.context
            aggregator, k, light = getattr(call, "_discovery", (None, self.max_candidates, ()))
            if not light:
                key = _reuse_key(call, aggregator, k)
                now = self.loop.time()
                servers = reuse.take(key, now)
                if servers is not None:
                    return self._seat(call, servers, k, now)
                joined = self._joining.get(key)
                if joined is not None:          # the same request is out: its answer serves this call too
                    joined.append((flight, a))
                    return None
                self._joining[key] = []
        self._start_discovery(flight, a, key)
        return None

    def _start_discovery(self, flight: Flight, a: Discover, key: tuple | None) -> None:
        # what to ask is read now: the call may end (cancelled) before the task's first step, and an
        # ended call's flight no longer names it (its discovery still serves the calls that joined it)
        call = flight.context
        what = (call.service, call.optional, *getattr(call, "_discovery", (None, self.max_candidates, ())))
        task = self.loop.create_task(self._discover_for(flight, a, key, what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _discover_for(self, flight: Flight, a: Discover, key: tuple | None, what: tuple) -> None:
        """Discover for ``flight`` (and, with a reuse ``key``, for the calls
        that joined it meanwhile); each gets the answer ranked for itself.
        ``what``: the call's service, optional, aggregator, k and data arguments."""
        service, optional, aggregator, k, light = what
        servers: list = []
        asked = k
        if key is not None:         # a server per call waiting for this answer and per server taken (reuse.py)
            asked = ask_for(k, 1 + len(self._joining.get(key, ())), len(self._reuse.in_flight))
        try:
            if self.closed:
                raise CommunicationError("client is closed")
            ask = self._discover_ranked(service, asked, aggregator, light, optional, None)
            if a.timeout is not None and a.timeout < self.discovery_timeout:
                servers, from_view = await asyncio.wait_for(ask, max(0.01, a.timeout))
            else:
                servers, from_view = await ask
        except asyncio.TimeoutError:
            mas = ", ".join(self.master_agents)
            event: Any = DiscoveryFailed("timeout", f"discovery of {service} timed out: the master agent"
                                         f"{'s' if len(self.master_agents) > 1 else ''} at {mas} did not answer "
                                         f"within {max(0.01, a.timeout or 0):.3g}s")
        except asyncio.CancelledError:      # the client is closing: the calls that joined fail
            event, flight = DiscoveryFailed("communication", "client closed"), None
        except GridRPCError as exc:
            event = DiscoveryFailed(kind_of(exc), str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the calls waiting on it fail, none hangs
            log.exception("%s: discovery of %s failed", self.user, service)
            event = DiscoveryFailed("internal", f"discovery of {service} failed: {exc!r}")
        else:
            event = Discovered(servers)
        reuse = self._reuse
        now = self.loop.time()
        calls = ([(flight, a)] if flight is not None else []) + (self._joining.pop(key, []) if key is not None else [])
        again: list = []
        if type(event) is Discovered and reuse is not None and servers:
            feed = self._driver.feed
            again = reuse.settle(key, servers, from_view, now, calls, flight,
                                 lambda f, ranked: feed(f, self._seat(f.context, ranked, k, now)))
        else:
            for f, _own in calls:
                if not f.machine.finished:
                    self._driver.feed(f, event)
        first = ask_again(self._joining, key, again)
        if first is not None:           # they ask the MA again (it knows other servers), as one discovery
            self._start_discovery(*first, key)

    def _seat(self, call: Call, ranked: list, k: int, now: float) -> Discovered:
        """``call`` takes the answer ``ranked`` for it (gridrpc.client.reuse):
        counted in flight on its first server, its first ``k`` servers as
        candidates, a late-binding probe when that server is free by this
        client's count, else queued there."""
        reuse = self._reuse
        free = reuse.free(ranked, now)
        call._chosen = reuse.begin(ranked)
        return Discovered(ranked[:k], free)

    async def _cancel_remote(self, call: Call) -> None:
        """Cancel ``call`` on its server; returns when the server confirmed (or
        after ``ack_timeout``). Nothing to do before the call is sent."""
        flight: Flight | None = getattr(call, "_flight", None)
        if flight is None or flight.machine.finished:
            return
        self._driver.cancel(flight)
        # a direct call has no waiter: its own future ends with the flight (a wait, not an await: its
        # error is the call's to report)
        await asyncio.wait([flight.waiter if flight.waiter is not None else call._task])

    # -- SeD sockets ------------------------------------------------------
    def _channel(self, address: str) -> Channel:
        ch = self._seds.get(address)
        if ch is None or ch.closed:
            if self.closed:
                raise CommunicationError("client is closed")
            opts = None
            if self._security is not None:
                key = self._server_keys.get(address)
                if key is None:
                    raise CommunicationError(f"security is on and the public key of the server at {address} "
                                             "is unknown: reach servers through the MA (discover, or "
                                             "handle(service, server=NAME)), which gives their keys")
                opts = self._security.client_options(key)
            on_message = (functools.partial(self._on_curve, address) if self._bulk is not None
                          else functools.partial(self._driver.on_message, address))
            ch = Channel(connect_dealer(address, options=opts), on_message, name=f"client->{address}")
            self._seds[address] = ch
        return ch

    def _send(self, address: str, frames: list) -> None:
        if self._bulk is not None and self._bulk.send(address, frames):
            return
        self._channel(address).send(frames)

    def _send_curve(self, address: str, frames: list) -> None:
        self._channel(address).send(frames)

    def _on_curve(self, address: str, frames: list) -> None:
        """A SeD's message over CURVE (secure clients): the answer to a bulk_open is the bulk
        sessions' own, the rest goes to the driver."""
        if not self._bulk.intercept(address, frames):
            self._driver.on_message(address, frames)

    def _on_bulk(self, address: str, frames: list) -> None:
        if not self.closed:
            self._driver.on_message(address, frames)

    def _decode(self, header: dict, frames: list):
        return codec.decode(header.get("value"), [f.buffer for f in frames[1:]], self.sink)



def _data():
    from . import data
    return data


def _reuse_key(call: Call, aggregator, k: int) -> tuple:
    return answer_key(call.service, call.optional, k, aggregator)


def _on_attempt(flight: Flight, a: SendCall) -> None:
    call = flight.context
    if call.id != a.id:
        call.attempts.append(a.id)
    call.id, call.server, call.address = a.id, a.server, a.address
    chosen = call._chosen
    if chosen is not None and chosen != a.server:   # passed on (busy probe, failover): counted where it is
        call._client._reuse.moved(chosen, a.server)
        call._chosen = a.server


class AsyncHandle:
    """A function handle: a service, optionally bound to one server (no
    discovery per call)."""

    def __init__(self, client: AsyncClient, service: str, server=None, optional: bool = False) -> None:
        self.client, self.service, self.server, self.optional = client, service, server, optional

    async def __call__(self, *args, **kwargs):
        return await self.client.call(self.service, *args, server=self.server, optional=self.optional, **kwargs)

    async def submit(self, *args, **kwargs) -> Call:
        return self.client.submit_nowait(self.service, *args, server=self.server, optional=self.optional, **kwargs)


def client_security(options, user: str, mas: int = 1):
    """``(Security, [MA public key, ...])`` for a client whose options name a
    key directory; ``(None, None)`` without security. ``ma_key`` may list
    one key per master agent, comma-separated, in the order of the
    addresses (several MAs: one key each); one key serves every MA."""
    if not options.keys:
        return None, None
    from ..errors import ConfigError
    from ..transport.security import KeyStore, Security, public_key_from
    store = KeyStore(options.keys)
    sec = Security(keys=store, name=options.key or user, role="user")
    sec.pair                                   # fails now, clearly, if the user's key is missing
    specs = [s.strip() for s in str(options.ma_key or "MA").split(",") if s.strip()] or ["MA"]
    if len(specs) > 1 and len(specs) != mas:
        raise ConfigError(f"ma_key lists {len(specs)} keys for {mas} master agent(s): give one key, or one per "
                          "master agent in the order of their addresses")
    publics = []
    for spec in specs:
        try:
            publics.append(store.public(spec, "element"))
        except Exception:  # noqa: BLE001 - not an element name: a literal key or a file
            publics.append(public_key_from(spec))
    return sec, publics
