"""Requests to servers over one channel each, with a bulk session over it under CURVE.

A client's data requests (:mod:`gridrpc.client.data`) and a SeD's fetches
from other SeDs (:mod:`gridrpc.sed.data.fetch`) send through a :class:`Pipe`
per server: its bulk session (:class:`gridrpc.transport.bulk_client.BulkLinks`,
AES-256-GCM on a second connection) when one is usable, else its CURVE
channel, over which the session is asked for and whose answer to that
question is consumed here. Without CURVE a pipe is its channel.
"""
from __future__ import annotations

import functools
import time
from typing import Callable

from ..errors import CommunicationError
from .channel import Channel, connect_dealer

__all__ = ["Pipe", "Pipes", "Sealing", "SEALED_FROM", "SESSION_WAIT"]

#: under CURVE, a request that sends or fetches this many bytes (known before it goes) first asks
#: for a bulk session and waits for it, so that the first large transfer is sealed too
SEALED_FROM = 1 << 20
#: how long such a request waits for its session to be usable (seconds); then it takes CURVE
SESSION_WAIT = 1.0


class Pipe:
    """What requests to the server at ``address`` are sent through: its bulk session when one is
    usable, else its CURVE channel (without CURVE: the channel). A :class:`Pipes` makes it and
    closes it (:meth:`Pipes.close_one`), with its session."""

    __slots__ = ("address", "channel", "_owner")

    def __init__(self, address: str, channel: Channel, owner: "Pipes") -> None:
        self.address, self.channel, self._owner = address, channel, owner

    @property
    def closed(self) -> bool:
        return self.channel.closed

    def send(self, frames: list) -> None:
        links = self._owner.links
        if links is None or not links.send(self.address, frames):
            self.channel.send(frames)


class Pipes:
    """The channels of one side's requests to servers (a client's data requests, a SeD's fetches
    from other SeDs): a :class:`Pipe` per address, least recently used first.

    ``deliver(address, frames)`` gets every message from a server, whichever way it came.
    ``secure``: the channels run CURVE (the options given to :meth:`connect` say so) and their
    requests take bulk sessions (:attr:`links`; None without CURVE); a server's answer to a
    ``bulk_open`` is consumed here. Closing a pipe closes its session."""

    def __init__(self, deliver: Callable[[str, list], None], *, secure: bool) -> None:
        self._deliver = deliver
        self._pipes: dict[str, Pipe] = {}
        #: the bulk sessions of these channels (None without CURVE)
        self.links = None
        if secure:
            from .bulk_client import BulkLinks
            self.links = BulkLinks(self._send_curve, deliver)

    def __len__(self) -> int:
        return len(self._pipes)

    def __iter__(self):
        """The addresses, least recently used first."""
        return iter(list(self._pipes))

    def __contains__(self, address: str) -> bool:
        return address in self._pipes

    def get(self, address: str) -> Pipe | None:
        """The open pipe to ``address``, now the most recently used; None when there is none (a
        closed one is forgotten)."""
        pipe = self._pipes.get(address)
        if pipe is None or pipe.closed:
            self.close_one(address)
            return None
        self._pipes[address] = self._pipes.pop(address)       # most recently used last
        return pipe

    def connect(self, address: str, options: dict | None, *, name: str) -> Pipe:
        """A new pipe to ``address``: a DEALER connected with ``options`` (CURVE's when secure),
        replacing any pipe to it."""
        self.close_one(address)
        on_message = functools.partial(self._on_curve if self.links is not None else self._deliver, address)
        channel = Channel(connect_dealer(address, options=options), on_message, name=name)
        pipe = self._pipes[address] = Pipe(address, channel, self)
        return pipe

    def close_one(self, address: str) -> None:
        """Close the pipe to ``address``, if any, and its session."""
        pipe = self._pipes.pop(address, None)
        if pipe is None:
            return
        pipe.channel.close()
        if self.links is not None:
            self.links.drop(address)

    async def sealed(self, address: str, wait: float) -> bool:
        """Before a request whose answer is known to be large: ask the server at ``address`` for a
        session now (unless one is open or asked: then wait for that one) and wait up to ``wait``
        seconds until it is usable, so that the request and its answer go sealed. True: the next
        message to it takes the session; False: it takes CURVE (no CURVE, no pipe to it, a
        session refused or failed lately, or not usable in time)."""
        links = self.links
        if links is None or address not in self._pipes:
            return False
        if links.usable(address):
            return True
        links.ask(address)                  # nothing sent when one is open or asked already
        end = time.monotonic() + wait
        while address in links and address in self._pipes and (left := end - time.monotonic()) > 0:
            await links.changed(address, left)
            if links.usable(address):
                return True
        return False                        # refused, failed, the pipe closed, or not in time

    def links_for(self, links, size, wait: float = SESSION_WAIT):
        """The links (``holder_channel``/``holder_done``) for a request that moves ``size`` bytes:
        ``links`` themselves, or, under CURVE from :data:`SEALED_FROM` bytes, a :class:`Sealing`
        of them that makes each holder's session usable before the request goes to it."""
        if self.links is None or type(size) is not int or size < SEALED_FROM:
            return links
        return Sealing(links, self, wait)

    def _send_curve(self, address: str, frames: list) -> None:
        pipe = self._pipes.get(address)
        if pipe is None or pipe.closed:
            raise CommunicationError(f"no connection to {address}")
        pipe.channel.send(frames)

    def _on_curve(self, address: str, frames: list) -> None:
        """A server's message over CURVE: the answer to a ``bulk_open`` is the sessions' own."""
        if not self.links.intercept(address, frames):
            self._deliver(address, frames)

    def close(self) -> None:
        for pipe in self._pipes.values():
            pipe.channel.close()
        self._pipes.clear()
        if self.links is not None:
            self.links.close()


class Sealing:
    """The links of one request that moves a large value: ``links``' channels, with the bulk
    session of each holder made usable (:meth:`Pipes.sealed`, up to ``wait`` seconds) before the
    request goes to it, so that its first large transfer is sealed too. The request is in flight
    meanwhile (its answer is awaited from the start)."""

    __slots__ = ("links", "pipes", "wait")

    def __init__(self, links, pipes: Pipes, wait: float) -> None:
        self.links, self.pipes, self.wait = links, pipes, wait

    async def holder_channel(self, name: str, address: str, header: dict) -> Pipe:
        pipe = await self.links.holder_channel(name, address, header)
        try:
            await self.pipes.sealed(address, self.wait)
        except BaseException:
            self.links.holder_done(address)         # the request never holds this pipe (cancelled)
            raise
        return pipe

    def holder_done(self, address: str) -> None:
        self.links.holder_done(address)
