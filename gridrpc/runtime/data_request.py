"""Requests for data to holder SeDs, on asyncio: the runtime of
:class:`gridrpc.core.data_request.DataRequest`, used by the client
(:mod:`gridrpc.client.data`) and by the SeD (:mod:`gridrpc.sed.data.fetch`).

:class:`DataRequests` matches answers to requests by id, notes when each
address was last heard from (any message: an answer, a reply to a ping),
and drives one machine per request: it sends what the machine says, waits
for the answer until the machine's next wake-up, and feeds back the answer
or the passing time. Where the sockets come from is the caller's: a
:class:`Links` opens the channel to a holder (the SeD bounds how many) and
is told when a holder is no longer used by a request.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Callable, Protocol, Sequence

from ..core import messages as m
from ..core.data_request import Answer, DataRequest, Done, Failed, GiveUp, Ping, Send, Start, Tick, Unreachable
from ..core.messages import MsgType
from ..errors import CommunicationError, ProtocolError
from ..transport.channel import Channel

__all__ = ["DataRequests", "Links", "Reply", "release_answer"]

#: a holder's answer: (message type, header, the frames after the header)
Reply = tuple[MsgType, dict, list]


class Links(Protocol):
    """Where a request's channels come from."""

    async def holder_channel(self, name: str, address: str, header: dict) -> Channel:
        """The channel to holder ``name`` at ``address`` for ``header`` (or
        anything with a channel's ``send``: a secure client's data requests
        take a bulk session when one is usable).
        CommunicationError: this holder cannot be reached (the next one is
        asked); any other error ends the request."""

    def holder_done(self, address: str) -> None:
        """A request opened with :meth:`holder_channel` no longer uses ``address``."""


class DataRequests:
    """The data requests of one client or SeD in flight, by id, and when each
    holder's address was last heard from. ``log``: where malformed messages
    are reported (``None``: dropped silently)."""

    def __init__(self, log: logging.Logger | None = None, owner: str = "") -> None:
        self._pending: dict[str, asyncio.Future] = {}
        self._heard: dict[str, float] = {}
        self._log = log
        self._owner = owner

    def on_message(self, address: str, frames: list) -> None:
        """A message from ``address`` (a channel's callback)."""
        try:
            mt, h = m.parse_header(frames[0].bytes)
        except ProtocolError as exc:
            if self._log is not None:
                self._log.warning("%s: bad data message from %s: %s", self._owner, address, exc)
            return
        self._heard[address] = time.monotonic()
        fut = self._pending.pop(h["id"], None)
        if fut is not None and not fut.done():
            fut.set_result((mt, h, frames[1:]))

    @property
    def in_flight(self) -> int:
        """Requests awaiting an answer."""
        return len(self._pending)

    def forget(self, address: str) -> None:
        """``address``'s channel is closed: its last sign of life no longer counts."""
        self._heard.pop(address, None)

    def close(self, error: BaseException | None = None) -> None:
        """Ends the requests in flight: with ``error``, else cancelled."""
        for fut in self._pending.values():
            if not fut.done():
                if error is None:
                    fut.cancel()
                else:
                    fut.set_exception(error)
        self._pending.clear()

    async def run(self, request: DataRequest, links: Links,
                  header_for: Callable[[Send], tuple[dict, Sequence]]) -> tuple[Done | Failed, Reply | None]:
        """Carry ``request`` out to its end: ``(Done, reply)`` or ``(Failed,
        None)``. ``header_for(send)``: the header (whose ``id`` is
        ``send.id``) and the buffers sent to ``send``'s holder."""
        todo = deque(request.handle(Start(), time.monotonic()))
        fut: asyncio.Future | None = None
        fut_id = ""
        ch: Channel | None = None
        opened: str | None = None           # the address whose channel the current request holds
        try:
            while True:
                while todo:
                    a = todo.popleft()
                    t = type(a)
                    if t is Send:
                        header, buffers = header_for(a)
                        fut, fut_id = asyncio.get_running_loop().create_future(), a.id
                        self._pending[a.id] = fut
                        try:
                            ch = await links.holder_channel(a.name, a.address, header)
                            opened = a.address
                            ch.send([m.dumps(header), *buffers])
                        except CommunicationError as exc:
                            todo.extend(request.handle(Unreachable(a.id, str(exc)), time.monotonic()))
                    elif t is Ping:
                        try:
                            ch.send([m.dumps(m.make(MsgType.PING, a.id, ids=[]))])
                        except CommunicationError as exc:
                            todo.extend(request.handle(Unreachable(request.current[0], str(exc)), time.monotonic()))
                    elif t is GiveUp:
                        if a.id and fut is not None:
                            self._drop(fut_id, fut)
                            fut = None
                        if opened is not None:
                            links.holder_done(opened)
                            opened = None
                    elif t is Done:
                        return a, fut.result()
                    else:                   # Failed
                        return a, None
                rid, _, address = request.current
                delay = max(0.0, request.next_wakeup() - time.monotonic())
                done, _ = await asyncio.wait({fut}, timeout=delay)
                now = time.monotonic()
                if done:
                    mt, h, _frames = fut.result()
                    todo.extend(request.handle(Answer(rid, h["error"] if mt is MsgType.ERROR else None), now))
                else:
                    todo.extend(request.handle(Tick(self._heard.get(address)), now))
        finally:
            if fut is not None:
                self._drop(fut_id, fut)
            if opened is not None:
                links.holder_done(opened)

    def _drop(self, rid: str, fut: asyncio.Future) -> None:
        self._pending.pop(rid, None)
        release_answer(fut)



def release_answer(fut: asyncio.Future) -> None:
    """A request's answer future as its request stops waiting (answered,
    timed out or cancelled): cancelled if still pending, else its outcome
    consumed. Closing a client fails its pending futures with "client
    closed"; a request cancelled just before never read that error, and
    asyncio would log "Future exception was never retrieved" when the
    future is collected."""
    if not fut.done():
        fut.cancel()
    elif not fut.cancelled():
        fut.exception()
