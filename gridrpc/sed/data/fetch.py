"""Fetching data from other SeDs (:mod:`gridrpc.sed.data.store`): a reference's
bytes come from this process, else from its holder, else a replica, over a
DEALER per holder (under CURVE with this SeD's element key, pinning the
holder's key); a holder silent for ``fetch_timeout`` is reported lost.

Under CURVE the requests to a holder and its answers take a bulk session
(:class:`~gridrpc.transport.pipes.Pipes`, as a client's data requests
do): AES-256-GCM on a second connection, keyed over the CURVE one. It is
asked before fetching a value whose reference says it is at least
:data:`~gridrpc.transport.pipes.SEALED_FROM` bytes (waiting up to :data:`SESSION_WAIT` for it), and
after any large answer that came over CURVE. The holder knows the session as
this SeD's CURVE peer: a request through it is this SeD's element key
speaking, exactly as over CURVE (it names the user it fetches for, and the
holder's ownership checks apply to that user).

The holder's address comes from a message (a reference, a ``data_put``'s
``source``), so the sockets it opens are bounded: only ``tcp://host:port``
addresses (never a path: no ``ipc://``), at most :data:`MAX_PEERS` holders
connected at once (the least recently used idle one is closed for a new
one; when all are busy the fetch fails at once, naming the limit), and a
holder unused for :data:`PEER_IDLE` seconds is disconnected (its bulk
session closed with it). Under CURVE a holder must be an element whose key
is in the key directory. Each fetch is a
:class:`~gridrpc.core.data_request.DataRequest` driven by
:class:`~gridrpc.runtime.data_request.DataRequests`, to which this class
gives the channels (its ``holder_channel`` and ``holder_done``).

:class:`Fetching` holds those methods; :class:`~gridrpc.sed.data.store.SedData`
inherits them and owns the state (``pipes``, ``_holder_keys``, ``_peer_busy``, ``_peer_used``,
``requests``, ``stats``).
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from ...core import messages as m
from ...core.data_request import DataRequest, Failed, GiveUp
from ...core.messages import MsgType
from ...core.refs import RefTag
from ...errors import CommunicationError, ConfigError, DataAccessDenied, DataError, DataLost, error_from_wire
from ...transport.pipes import SESSION_WAIT, Pipe

__all__ = ["Fetching"]

log = logging.getLogger("gridrpc.sed.data.store")      # the data runtime's one logger

#: holders connected at once (each a socket and a descriptor)
MAX_PEERS = 32
#: a holder unused this long (seconds) is disconnected
PEER_IDLE = 30.0
#: how long a holder's element key, or its absence, is remembered (seconds)
KEY_MEMORY = 5.0
#: holders whose key (or its absence) is remembered at once
MAX_KEYS_REMEMBERED = 1024
_TCP = re.compile(r"tcp://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})")


def check_peer_address(address: object) -> str:
    """A holder's address from a message: ``tcp://host:port`` only."""
    m_ = _TCP.fullmatch(address) if isinstance(address, str) else None
    if m_ is None or not 1 <= int(m_.group(1)) <= 65535:
        raise DataError(f"a data holder's address must be tcp://host:port, not {str(address)[:80]!r}")
    return address


class Fetching:
    """How :class:`~gridrpc.sed.data.store.SedData` gets references held elsewhere."""

    def _peer_options(self, header: dict) -> dict | None:
        """Under CURVE a SeD fetches with its own element key, pinning the
        holder's public key from the shared key directory (by the holder's
        name, which the reference names)."""
        sec = self.sed.security
        if sec is None or not sec.enabled:
            return None
        holder = header.get("sed")
        if not isinstance(holder, str):
            raise CommunicationError("cannot fetch data securely: the holder's name is unknown")
        # the holder's own element key, else its process's (replica ``sed-1-01`` of ``sed-1``)
        public = self._holder_key(holder, sec.keys)
        if public is None:
            raise DataError(f"data holder {holder!r} is not an element of this site (no element key for "
                            f"{holder!r} or {holder.rsplit('-', 1)[0]!r} in the key directory)")
        return sec.client_options(public)

    def _holder_key(self, holder: str, keys) -> bytes | None:
        """The element key of ``holder`` (or of its process), None when there is none, remembered
        for :data:`KEY_MEMORY` seconds (at most :data:`MAX_KEYS_REMEMBERED` names, oldest
        forgotten first): a flood of puts naming unknown holders costs a dictionary lookup each,
        not two key files looked for; a key added to the directory is seen within that time."""
        now = time.monotonic()
        known = self._holder_keys.get(holder)
        if known is not None and known[0] > now:
            return known[1]
        public = None
        for name in (holder, holder.rsplit("-", 1)[0]):
            try:
                public = keys.public(name, "element")
                break
            except ConfigError:
                continue
        self._holder_keys.pop(holder, None)
        if len(self._holder_keys) >= MAX_KEYS_REMEMBERED:
            del self._holder_keys[next(iter(self._holder_keys))]
        self._holder_keys[holder] = (now + KEY_MEMORY, public)
        return public

    def check_source(self, src: dict) -> None:
        """A ``data_put``'s ``source``, refused before any fetch starts when no fetch could use
        it: an address that is not ``tcp://host:port`` or, under CURVE, a holder with no
        element key (a flood of such puts costs a check each, not a fetch each)."""
        if src.get("name") in self.sed.replicas or src.get("address") == self.sed.address:
            return
        check_peer_address(src.get("address"))
        self._peer_options({"sed": src.get("name")})

    # -- Links (gridrpc.runtime.data_request): the channels of the fetches -------------------------
    async def holder_channel(self, name: str, address: str, header: dict) -> Pipe:
        """The pipe to a holder, counted busy until :meth:`holder_done`."""
        pipe = self._peer(address, header)
        self._peer_busy[address] = self._peer_busy.get(address, 0) + 1
        return pipe

    def holder_done(self, address: str) -> None:
        busy = self._peer_busy[address] - 1
        if address in self.pipes:
            self._peer_busy[address] = busy
            self._peer_used[address] = time.monotonic()
        elif busy:
            self._peer_busy[address] = busy
        else:
            del self._peer_busy[address]

    def _peer(self, address: str, header: dict) -> Pipe:
        """The pipe to a holder: reused, else opened within :data:`MAX_PEERS`."""
        check_peer_address(address)
        pipe = self.pipes.get(address)              # now the most recently used
        if pipe is not None:
            return pipe
        self._close_idle_peers(time.monotonic())
        if len(self.pipes) >= MAX_PEERS:
            idle = next((a for a in self.pipes if not self._peer_busy.get(a)), None)
            if idle is None:
                raise DataError(f"SeD {self.sed.name} is already fetching from {MAX_PEERS} data holders "
                                "(its limit); try again later")
            self._close_peer(idle)
        pipe = self.pipes.connect(address, self._peer_options(header), name=f"{self.sed.name}->{address}")
        self._peer_used[address] = time.monotonic()
        if self._peer_sweep is None:
            self._peer_sweep = asyncio.get_running_loop().call_later(PEER_IDLE, self._sweep_peers)
        return pipe

    def _close_peer(self, address: str) -> None:
        self.pipes.close_one(address)               # its bulk session too
        self._peer_used.pop(address, None)
        self.requests.forget(address)
        if not self._peer_busy.get(address):
            self._peer_busy.pop(address, None)

    def _close_idle_peers(self, now: float) -> None:
        for address in [a for a in self.pipes if not self._peer_busy.get(a)
                        and now - self._peer_used.get(a, now) >= PEER_IDLE]:
            self._close_peer(address)

    def _sweep_peers(self) -> None:
        self._peer_sweep = None
        self._close_idle_peers(time.monotonic())
        if len(self.pipes) and not self.sed.endpoint.closed:
            self._peer_sweep = asyncio.get_running_loop().call_later(PEER_IDLE / 2, self._sweep_peers)

    async def fetch(self, tag: RefTag, user: str, wait: float | None = None) -> tuple[Any, list]:
        """``(tree, buffers)`` of a reference: from this process, else from its
        holder, else a replica. DataLost / DataAccessDenied otherwise."""
        from ...client.ids import new_id
        ref, is_call = tag.id, bool(tag.desc.get("call"))
        wait = self.config.max_wait if wait is None else wait
        holders = tag.holders()
        for name, address in holders:
            if name in self.sed.replicas or (address and address == self.sed.address):
                if is_call:
                    tree, buffers, _ = await self._call_result(ref, user, wait)
                    return tree, buffers
                tree, buffers, _ = await self.local_value(ref, user, transfer=False, wait=wait)
                return tree, buffers

        def header_for(send):
            return m.make(MsgType.DATA_GET, send.id, ref=ref, user=user, wait=wait, transfer=True, call=is_call,
                          sed=send.name), ()
        t = self.config.fetch_timeout
        req = DataRequest(holders, timeout=t + wait, silence=t, new_id=new_id, retry=_next_holder_on)
        size = tag.desc.get("size")
        links = self.pipes.links_for(self, size, SESSION_WAIT)
        end, answer = await self.requests.run(req, links, header_for)
        if type(end) is Failed:
            if end.error is not None:
                err = error_from_wire(end.error)
                if isinstance(err, DataAccessDenied):
                    raise err
                raise DataError(f"data reference {ref}: {end.error.get('message')}")
            raise DataLost(f"data reference {ref} could not be fetched: " + "; ".join(map(_reason, end.given_up)))
        _mt, hh, frames = answer
        buffers = [f.buffer for f in frames]
        self.stats["fetched"] += 1
        self.stats["fetched_bytes"] += sum(len(b) for b in buffers)
        return hh.get("value"), buffers


def _reason(g: GiveUp) -> str:
    """Why a holder could not give the value, for the DataLost message."""
    if g.error is not None:
        return f"{g.name}: {g.error.get('message')}"
    if not g.address:
        return f"{g.name}: {g.why}"
    return f"holder {g.name} ({g.address}) {g.why}: lost?"


def _next_holder_on(error: dict) -> bool:
    """A holder's error answer after which the next holder is asked: any but
    a refusal (another user's data) or a data error other than a loss."""
    err = error_from_wire(error)
    return not isinstance(err, DataError) or isinstance(err, DataLost)
