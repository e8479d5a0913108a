"""Fetching data from other SeDs (:mod:`gridrpc.sed.data`): a reference's
bytes come from this process, else from its holder, else a replica, over a
DEALER per holder (under CURVE with this SeD's element key, pinning the
holder's key); a holder silent for ``fetch_timeout`` is reported lost.

:class:`Fetching` holds those methods; :class:`~gridrpc.sed.data.SedData`
inherits them and owns the state (``_peers``, ``_requests``, ``_heard``,
``stats``).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from ..core import messages as m
from ..core.messages import MsgType
from ..core.refs import RefTag
from ..errors import CommunicationError, DataAccessDenied, DataError, DataLost, ProtocolError, error_from_wire
from ..transport.channel import Channel, connect_dealer

__all__ = ["Fetching"]

log = logging.getLogger("gridrpc.sed.data")      # the data runtime's one logger


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
        return sec.client_options(sec.keys.public(base, "element"))

    async def _request(self, address: str, header: dict, timeout: float) -> tuple:
        """Send and wait for the answer; while waiting (a pending producer), the
        holder is pinged: silent for ``fetch_timeout`` means lost."""
        from ..client.ids import new_id
        ch = self._peers.get(address)
        if ch is None or ch.closed:
            ch = self._peers[address] = Channel(connect_dealer(address, options=self._peer_options(header)),
                                                functools.partial(self._on_peer, address),
                                                name=f"{self.sed.name}->{address}")
        fut = asyncio.get_running_loop().create_future()
        self._requests[header["id"]] = fut
        start = time.monotonic()
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
