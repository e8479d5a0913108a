"""Fetching data from other SeDs (:mod:`gridrpc.sed.data`): a reference's
bytes come from this process, else from its holder, else a replica, over a
DEALER per holder (under CURVE with this SeD's element key, pinning the
holder's key); a holder silent for ``fetch_timeout`` is reported lost.

The holder's address comes from a message (a reference, a ``data_put``'s
``source``), so the sockets it opens are bounded: only ``tcp://host:port``
addresses (never a path: no ``ipc://``), at most :data:`MAX_PEERS` holders
connected at once (the least recently used idle one is closed for a new
one; when all are busy the fetch fails at once, naming the limit), and a
holder unused for :data:`PEER_IDLE` seconds is disconnected. Under CURVE a
holder must be an element whose key is in the key directory.

:class:`Fetching` holds those methods; :class:`~gridrpc.sed.data.SedData`
inherits them and owns the state (``_peers``, ``_requests``, ``_heard``,
``stats``).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from typing import Any

from ..core import messages as m
from ..core.messages import MsgType
from ..core.refs import RefTag
from ..errors import CommunicationError, ConfigError, DataAccessDenied, DataError, DataLost, ProtocolError, error_from_wire
from ..transport.channel import Channel, connect_dealer

__all__ = ["Fetching"]

log = logging.getLogger("gridrpc.sed.data")      # the data runtime's one logger

#: holders connected at once (each a socket and a descriptor)
MAX_PEERS = 32
#: a holder unused this long (seconds) is disconnected
PEER_IDLE = 30.0
_TCP = re.compile(r"tcp://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})")


def check_peer_address(address: object) -> str:
    """A holder's address from a message: ``tcp://host:port`` only."""
    m_ = _TCP.fullmatch(address) if isinstance(address, str) else None
    if m_ is None or not 1 <= int(m_.group(1)) <= 65535:
        raise DataError(f"a data holder's address must be tcp://host:port, not {str(address)[:80]!r}")
    return address


class Fetching:
    """How :class:`~gridrpc.sed.data.SedData` gets references held elsewhere."""

    def _on_peer(self, address: str, frames: list) -> None:
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            log.warning("SeD %s: bad data message from %s: %s", self.sed.name, address, exc)
            return
        self._heard[address] = time.monotonic()
        fut = self._requests.pop(h["id"], None)
        if fut is not None and not fut.done():
            fut.set_result((mt, h, frames[1:]))

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
        base = holder.rsplit("-", 1)[0] if holder not in {n for _, n, _, _ in sec.keys.entries()} else holder
        try:
            return sec.client_options(sec.keys.public(base, "element"))
        except ConfigError:
            raise DataError(f"data holder {holder!r} is not an element of this site (no element key for "
                            f"{base!r} in the key directory)") from None

    async def _request(self, address: str, header: dict, timeout: float) -> tuple:
        """Send and wait for the answer; while waiting (a pending producer), the
        holder is pinged: silent for ``fetch_timeout`` means lost."""
        from ..client.ids import new_id
        ch = self._peer(address, header)
        fut = asyncio.get_running_loop().create_future()
        self._requests[header["id"]] = fut
        start = time.monotonic()
        self._peer_busy[address] = self._peer_busy.get(address, 0) + 1
        try:
            ch.send([m.dumps(header)])
            while True:
                done, _ = await asyncio.wait({fut}, timeout=min(1.0, self.config.fetch_timeout / 3))
                if done:
                    return fut.result()
                now = time.monotonic()
                if now - max(start, self._heard.get(address, start)) > self.config.fetch_timeout or now - start > timeout:
                    raise asyncio.TimeoutError()
                ch.send([m.dumps(m.make(MsgType.PING, new_id(), ids=[]))])
        finally:
            self._requests.pop(header["id"], None)
            busy = self._peer_busy[address] - 1
            if address in self._peers:
                self._peer_busy[address] = busy
                self._peer_used[address] = time.monotonic()
            elif busy:
                self._peer_busy[address] = busy
            else:
                del self._peer_busy[address]

    def _peer(self, address: str, header: dict) -> Channel:
        """The channel to a holder: reused, else opened within :data:`MAX_PEERS`."""
        check_peer_address(address)
        ch = self._peers.pop(address, None)
        if ch is not None and not ch.closed:
            self._peers[address] = ch               # most recently used last
            return ch
        self._close_idle_peers(time.monotonic())
        if len(self._peers) >= MAX_PEERS:
            idle = next((a for a in self._peers if not self._peer_busy.get(a)), None)
            if idle is None:
                raise DataError(f"SeD {self.sed.name} is already fetching from {MAX_PEERS} data holders "
                                "(its limit); try again later")
            self._close_peer(idle)
        options = self._peer_options(header)
        ch = self._peers[address] = Channel(connect_dealer(address, options=options),
                                            functools.partial(self._on_peer, address),
                                            name=f"{self.sed.name}->{address}")
        self._peer_used[address] = time.monotonic()
        if self._peer_sweep is None:
            self._peer_sweep = asyncio.get_running_loop().call_later(PEER_IDLE, self._sweep_peers)
        return ch

    def _close_peer(self, address: str) -> None:
        ch = self._peers.pop(address, None)
        if ch is not None:
            ch.close()
        self._peer_used.pop(address, None)
        self._heard.pop(address, None)
        if not self._peer_busy.get(address):
            self._peer_busy.pop(address, None)

    def _close_idle_peers(self, now: float) -> None:
        for address in [a for a in self._peers if not self._peer_busy.get(a)
                        and now - self._peer_used.get(a, now) >= PEER_IDLE]:
            self._close_peer(address)

    def _sweep_peers(self) -> None:
        self._peer_sweep = None
        self._close_idle_peers(time.monotonic())
        if self._peers and not self.sed.endpoint.closed:
            self._peer_sweep = asyncio.get_running_loop().call_later(PEER_IDLE / 2, self._sweep_peers)

    async def fetch(self, tag: RefTag, user: str, wait: float | None = None) -> tuple[Any, list]:
        """``(tree, buffers)`` of a reference: from this process, else from its
        holder, else a replica. DataLost / DataAccessDenied otherwise."""
        from ..client.ids import new_id
        ref, is_call = tag.id, bool(tag.desc.get("call"))
        wait = self.config.max_wait if wait is None else wait
        reasons = []
        for name, address in tag.holders():
            if name in self.sed.replicas or (address and address == self.sed.address):
                if is_call:
                    tree, buffers, _ = await self._call_result(ref, user, wait)
                    return tree, buffers
                tree, buffers, _ = await self.local_value(ref, user, transfer=False, wait=wait)
                return tree, buffers
            if not address:
                reasons.append(f"{name}: no address")
                continue
            h = m.make(MsgType.DATA_GET, new_id(), ref=ref, user=user, wait=wait, transfer=True, call=is_call,
                       sed=name)
            try:
                mt, hh, frames = await self._request(address, h, self.config.fetch_timeout + wait)
            except (asyncio.TimeoutError, CommunicationError) as exc:
                reasons.append(f"holder {name} ({address}) did not answer ({type(exc).__name__}): lost?")
                continue
            if mt is MsgType.ERROR:
                err = error_from_wire(hh["error"])
                if isinstance(err, DataAccessDenied):
                    raise err
                reasons.append(f"{name}: {hh['error'].get('message')}")
                if isinstance(err, DataError) and not isinstance(err, DataLost):
                    raise DataError(f"data reference {ref}: {hh['error'].get('message')}")
                continue
            buffers = [f.buffer for f in frames]
            self.stats["fetched"] += 1
            self.stats["fetched_bytes"] += sum(len(b) for b in buffers)
            return hh.get("value"), buffers
        raise DataLost(f"data reference {ref} could not be fetched: " + "; ".join(reasons))
