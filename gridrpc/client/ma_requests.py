"""The asyncio client's requests to its master agents (:mod:`gridrpc.client.aio`):
one DEALER per MA, requests matched to answers by id, hedged over several MAs
(an MA that cannot be sent to, or stays silent for ``MA_HEDGE_S``, is skipped;
the first answer wins; an MA still rebuilding its tree is avoided); the
discovery, the catalogue and the tree; the servers' addresses and public keys
learnt from the answers.

:class:`MasterAgentRequests` holds those methods; :class:`~gridrpc.client.aio.
AsyncClient` inherits them and owns the state (``_mas``, ``_ma_current``,
``_pending``, ``_server_addresses``, ``_server_keys``).
"""
from __future__ import annotations

import asyncio
import logging

import orjson
from typing import Any

from ..core import codec
from ..core import messages as m
from ..core.discovery import joined_ranking
from ..core.messages import MsgType
from ..errors import (AuthenticationError, CommunicationError, NoServerAvailable, ProtocolError, ServiceNotFound,
                      error_from_wire)
from ..runtime.data_request import release_answer
from ..transport.handshake import explain
from .futures import ServerInfo
from .ids import new_id

__all__ = ["MasterAgentRequests", "release_answer", "joined_ranking"]

#: while waiting for the master agent, how often its handshake is checked for a refused key (seconds)
HANDSHAKE_CHECK_S = 0.25

log = logging.getLogger("gridrpc.client.aio")      # the asyncio client's one logger


class MasterAgentRequests:
    """The master agent requests of :class:`~gridrpc.client.aio.AsyncClient`."""

    def _on_ma(self, index: int, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            log.warning("bad message from the MA: %s", exc)
            return
        fut = self._pending.get(h["id"])
        if fut is None or fut.done():
            return
        if (mt is MsgType.ERROR and h["error"].get("kind") == "rebuilding" and len(self._mas) > 1
                and index == self._ma_current):
            self._ma_current = (index + 1) % len(self._mas)     # prefer an MA whose tree is complete
        elif mt is not MsgType.ERROR or h["error"].get("kind") != "rebuilding":
            self._ma_current = index
        del self._pending[h["id"]]
        fut.set_result((mt, h))

    #: with several master agents, a request unanswered this long is also sent to the next one
    MA_HEDGE_S = 0.4

    async def _ma_request(self, header: dict, timeout: float) -> tuple[MsgType, dict]:
        """Send to the preferred master agent; with several, an MA that cannot
        be sent to, or is silent for ``MA_HEDGE_S``, is skipped: the request
        goes to the next one too and the first answer wins."""
        if not self._mas:
            raise ServiceNotFound("this client has no master agent: bind handles to servers by address")
        fut = self.loop.create_future()
        self._pending[header["id"]] = fut
        frames = [m.dumps(header)]
        n = len(self._mas)
        end = self.loop.time() + timeout
        try:
            for k in range(n):
                ch = self._mas[(self._ma_current + k) % n]
                try:
                    ch.send(frames)
                except CommunicationError:
                    continue
                left = end - self.loop.time()
                if k == n - 1 or left <= 0:
                    break                       # the last MA asked: wait below
                done, _ = await asyncio.wait([fut], timeout=min(left, self.MA_HEDGE_S))
                if done:
                    return fut.result()
            while (left := end - self.loop.time()) > 0:
                done, _ = await asyncio.wait([fut], timeout=min(left, HANDSHAKE_CHECK_S))
                if done:
                    return fut.result()
                self._raise_if_refused()        # a key problem is known at once: no need to wait it out
            raise asyncio.TimeoutError
        except asyncio.TimeoutError:
            self._raise_if_refused()
            raise CommunicationError(f"the master agent{'s' if n > 1 else ''} at "
                                     f"{', '.join(self.master_agents)} did not answer within {timeout}s") from None
        finally:
            self._pending.pop(header["id"], None)
            release_answer(fut)

    def _raise_if_refused(self) -> None:
        """AuthenticationError when every master agent failed its handshake
        with this client (and none succeeded since): says why."""
        watches = getattr(self, "_ma_watches", ())
        if not watches:
            return
        failures = [w.failed() for w in watches]
        if any(f is None for f in failures):
            return
        key = self._security.name if self._security is not None else None
        reasons = [explain(f, what=f"the master agent at {a}", secure=self._security is not None, key=key)
                   for f, a in zip(failures, self.master_agents)]
        raise AuthenticationError("; ".join(dict.fromkeys(reasons)))

    async def discover(self, service: str, max_servers: int = 10, *, aggregator: Any = None,
                       args: tuple = (), optional: bool = False,
                       max_age: float | None = None) -> list[ServerInfo]:
        """Ranked servers (best first) offering ``service``: min(max_servers, available).
        ``max_age``: seconds the MA's pushed view may be old to answer from
        it (0: always ask the servers, a fan-out); None: the MA's default.
        Always asks the MA (``reuse_discovery`` applies to calls only).
        An MA still rebuilding its tree after a restart (no child offers
        ``service`` yet) is asked again with the calls' backoff (50 ms
        doubling to 1 s) for up to ``retry_timeout`` s, as calls and the
        gevent client do; its ``NoServerAvailable`` is raised after that."""
        until = self.loop.time() + self.options.retry_timeout
        delay = 0.05
        while True:
            try:
                return (await self._discover_ranked(service, max_servers, aggregator, args, optional,
                                                    max_age))[0]
            except NoServerAvailable as exc:
                if getattr(exc, "kind", None) != "rebuilding" or self.loop.time() + delay > until:
                    raise
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    async def _discover_ranked(self, service: str, max_servers: int, aggregator: Any, args: tuple,
                               optional: bool, max_age: float | None) -> tuple[list[ServerInfo], bool]:
        """The servers of a discovery, and whether the MA answered from its view."""
        o = self.options
        if not o.share_discovery:
            entries, from_view = await self._discover(service, max_servers, aggregator, args, optional, max_age)
        else:
            key = _share_key(self, service, max_servers, aggregator, args, optional, max_age)
            shared = _SHARED.get(key)
            if shared is not None:
                # the j-th joiner starts j places further down the ranking, as the MA's memory
                # of its recent choices spreads separate discoveries: users who got one answer
                # do not all put their first calls on the same servers
                shared[1] += 1
                j = shared[1]
                entries, from_view = await asyncio.shield(shared[0])
                entries = joined_ranking(entries, j)
            else:
                fut = self.loop.create_future()
                _SHARED[key] = [fut, 0]
                try:
                    entries, from_view = await self._discover(service, max_servers, aggregator, args, optional,
                                                              max_age)
                except BaseException as exc:
                    fut.set_exception(exc if isinstance(exc, Exception) else CommunicationError(str(exc)))
                    fut.exception()         # retrieved: no warning when nobody joined
                    raise
                else:
                    fut.set_result((entries, from_view))
                finally:
                    if _SHARED.get(key, (None,))[0] is fut:
                        del _SHARED[key]
        servers = [ServerInfo(name=s["name"], address=s["address"], estimation=s.get("estimation") or {},
                              idempotent=s.get("idempotent") is not False)
                   for s in entries]
        for s in entries:
            self._server_addresses[s["name"]] = s["address"]
            self._learn_key(s["address"], s.get("public_key"))
        return servers, from_view

    async def _discover(self, service: str, max_servers: int, aggregator: Any, args: tuple, optional: bool,
                        max_age: float | None) -> tuple[list[dict], bool]:
        """The MA's answer: its server entries, checked, and whether it came
        from the MA's view."""
        o = self.options
        h = m.make(MsgType.DISCOVER, new_id(), service=service, k=int(max_servers), user=self.user,
                   aggregator=aggregator if aggregator is not None else o.aggregator,
                   budget_ms=o.budget * 1000, optional=bool(optional),
                   args=[codec.light_description(a) for a in args])
        if max_age is not None:
            h["max_age_ms"] = max(0.0, float(max_age)) * 1000.0
        mt, r = await self._ma_request(h, o.discovery_timeout)
        if mt is MsgType.ERROR:
            raise error_from_wire(r["error"])
        return ([s for s in r.get("servers", []) if isinstance(s, dict) and "name" in s and "address" in s],
                r.get("view") is True)

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
        for name, key in (r.get("keys") or {}).items():
            self._learn_key(self._server_addresses.get(name), key)
        return r["services"]

    async def dealer_options(self, address: str) -> dict | None:
        """Socket options for a connection to the SeD at ``address`` (CURVE:
        its public key, asked from the MA's catalogue if not known yet)."""
        if self._security is None:
            return None
        if address not in self._server_keys:
            await self.services()
        key = self._server_keys.get(address)
        if key is None:
            raise CommunicationError(f"security is on and the MA knows no public key for the server at {address}")
        return self._security.client_options(key)

    def _learn_key(self, address: str | None, key) -> None:
        if address and isinstance(key, str) and len(key) == 40:
            self._server_keys[address] = key.encode("ascii")

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


#: discoveries in flight that clients with ``share_discovery`` may join
_SHARED: dict[tuple, list] = {}         # key -> [the asker's future, how many joined it so far]


def _share_key(client, service, k, aggregator, args, optional, max_age) -> tuple:
    o = client.options
    agg = aggregator if aggregator is not None else o.aggregator
    light = [codec.light_description(a) for a in args]
    return (id(client.loop), tuple(client.master_agents), o.keys, o.key, o.ma_key, service, int(k),
            orjson.dumps(agg, option=orjson.OPT_SORT_KEYS), orjson.dumps(light, option=orjson.OPT_SORT_KEYS),
            bool(optional), max_age)
