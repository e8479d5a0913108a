"""The client's side of bulk sessions (gridrpc.transport.bulk): one per SeD.

A secure :class:`gridrpc.AsyncClient` holds a :class:`BulkLinks` for its
calls; data requests, a client's (:mod:`gridrpc.client.data`) and a SeD's
fetches from other SeDs (:mod:`gridrpc.sed.data.fetch`), hold one each
through :class:`gridrpc.transport.pipes.Pipes`, over their own CURVE
connections. Each asks a SeD for a session over CURVE the first time a
message with a large frame goes to it or comes from it (or before a request
whose answer is known to be large: :meth:`BulkLinks.ask`), connects the
session's bulk socket, and from then on sends every message to that SeD
sealed through it; until the session is usable, and whenever it fails,
messages go over CURVE.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from typing import Callable

import zmq

from ..errors import CommunicationError, ProtocolError
from .bulk import RESET, ZERO_COPY, BulkRefused, OutputBuffers, Sealer, check_preamble
from .channel import frame_size

log = logging.getLogger(__name__)

__all__ = ["BulkClient", "BulkLinks"]


class BulkClient:
    """The client's side of one session with the server at ``address``.

    ``on_message(frames)`` gets each accepted message (header, buffers).
    :meth:`usable` says whether messages may take the session now: once the
    bulk connection completed its handshake, and until the server refused it or
    said it does not know the session."""

    def __init__(self, address: str, opened: dict, ident: bytes, on_message: Callable[[list], None],
                 buffers: OutputBuffers | None = None, on_handshake: Callable[[], None] | None = None) -> None:
        from .channel import Channel, connect_dealer, host_of
        from .handshake import HandshakeWatch
        self.sealer = Sealer(bytes.fromhex(opened["session"]), bytes.fromhex(opened["key"]), server=False,
                             buffers=buffers)
        self.on_message = on_message
        self.address = f"tcp://{host_of(address)}:{int(opened['port'])}"
        self.ready = False
        self.dead = False
        self.refused = 0
        self.last_used = time.monotonic()
        watch: list = []
        opts = {zmq.PLAIN_USERNAME: opened["session"].encode(), zmq.PLAIN_PASSWORD: opened["token"].encode(),
                zmq.MAXMSGSIZE: -1}
        # immediate: a message never waits for a connection that is not up (a restarted server's
        # bulk port is another one): the send fails and the message takes CURVE
        sock = connect_dealer(self.address, identity=ident, immediate=True, options=opts,
                              before_connect=lambda s: watch.append(HandshakeWatch(s)))
        self._watch = watch[0]
        if on_handshake is not None:        # told when the bulk connection's handshake ends, either way
            self._watch.on_event(on_handshake)
        self.channel = Channel(sock, self._recv, name=f"client->{self.address} (bulk)")

    def usable(self) -> bool:
        if self.dead:
            return False
        # the handshake is watched for as long as the link lives: a reconnection the server refuses
        # (it restarted and forgot the session) ends the link instead of queueing messages forever
        if self._watch.failed() is not None:
            log.warning("bulk connection to %s refused: back to CURVE", self.address)
            self.dead = True
            return False
        if not self.ready and self._watch.succeeded:
            self.ready = True
        return self.ready

    def send(self, frames: list) -> None:
        self.channel.send(self.sealer.seal(frames))
        self.last_used = time.monotonic()

    def _recv(self, frames: list) -> None:
        if len(frames) == 1 and frames[0].bytes == RESET:
            log.info("%s does not know this bulk session any more: back to CURVE", self.address)
            self.dead = True
            return
        try:
            check_preamble(frames)
            plain = self.sealer.open(frames)
        except BulkRefused as exc:
            self.refused += 1
            if self.refused <= 10:
                log.warning("refused a sealed message from %s: %s", self.address, exc)
            return
        self.on_message(plain)

    def close(self) -> None:
        self._watch.close()
        self.channel.close()


def _nbytes(frames) -> int:
    return sum(map(frame_size, frames))


def _has_big(frames) -> bool:
    """Whether a frame (received ones included, unlike :func:`~gridrpc.transport.channel.has_big`)
    is large enough to go zero-copy."""
    return any(frame_size(f) >= ZERO_COPY for f in frames)


class BulkLinks:
    """A client's bulk sessions, one per server address.

    ``send_curve(address, frames)`` sends over the CURVE socket to a server;
    ``deliver(address, frames)`` hands on a message that came through a
    session. A session is asked for the first time a message with a large
    frame goes to a server, or comes from it; until it is usable, and after
    it failed (then asked again at most every :attr:`RETRY_S`), messages take
    CURVE."""

    RETRY_S = 30.0
    #: a link unused this long is given up (and asked again when needed): the server closes
    #: sessions idle for twice as long (BulkServer.IDLE_S) to make room
    IDLE_S = 300.0

    def __init__(self, send_curve: Callable[[str, list], None], deliver: Callable[[str, list], None]) -> None:
        self._send_curve = send_curve
        self._deliver = deliver
        self._links: dict[str, BulkClient] = {}
        self._asked: dict[str, tuple[str, bytes]] = {}     # address -> (request id, routing id to use)
        self._retry_at: dict[str, float] = {}
        self._waiting: dict[str, list] = {}         # address -> futures of :meth:`changed`
        self._buffers = OutputBuffers()             # shared by every link of this client
        #: messages (and their bytes after the header) sent and received through sessions
        self.stats = {"sent": 0, "sent_bytes": 0, "received": 0, "received_bytes": 0}

    def _delivered(self, address: str, frames: list) -> None:
        self.stats["received"] += 1
        self.stats["received_bytes"] += _nbytes(frames[1:])
        self._deliver(address, frames)

    def send(self, address: str, frames: list) -> bool:
        """Send through the session with ``address``; False: the caller sends over CURVE."""
        link = self._links.get(address)
        if link is not None and time.monotonic() - link.last_used > self.IDLE_S:
            link.close()
            del self._links[address]
            link = None
        if link is not None:
            if link.usable():
                if not Sealer.fits(frames):
                    return False
                try:
                    link.send(frames)
                    self.stats["sent"] += 1
                    self.stats["sent_bytes"] += _nbytes(frames[1:])
                    return True
                except CommunicationError as exc:
                    log.info("bulk connection to %s is down (%s): back to CURVE", link.address, exc)
                    link.dead = True
            if link.dead:
                self._give_up(address, link)
            return False
        if _has_big(frames):
            self.ask(address)          # nothing sent when one is asked already
        return False

    def _give_up(self, address: str, link: BulkClient) -> None:
        link.close()
        del self._links[address]
        self._retry_at[address] = time.monotonic() + self.RETRY_S
        self._settle(address)

    async def changed(self, address: str, wait: float) -> None:
        """Return when the session with ``address`` may have changed (answered, refused, its
        connection's handshake ended, given up, dropped), or after ``wait`` seconds."""
        import asyncio
        fut = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(address, [])
        waiting.append(fut)
        try:
            await asyncio.wait((fut,), timeout=wait)
        finally:
            if fut in waiting:
                waiting.remove(fut)
            if not waiting:
                self._waiting.pop(address, None)

    def _settle(self, address: str) -> None:
        for fut in self._waiting.pop(address, ()):
            if not fut.done():
                fut.set_result(None)

    def __contains__(self, address: str) -> bool:
        """Whether a session with ``address`` is open (usable or connecting) or asked."""
        return address in self._links or address in self._asked

    def ask(self, address: str) -> bool:
        """Ask ``address`` for a session over CURVE; False (nothing sent) when a session with it is
        open or asked already, or one failed less than :attr:`RETRY_S` ago."""
        if address in self or time.monotonic() < self._retry_at.get(address, 0.0):
            return False
        from ..core import messages as m
        from ..core.messages import MsgType
        from .channel import routing_id
        rid, ident = f"bulk-{os.urandom(8).hex()}", routing_id()
        self._asked[address] = (rid, ident)
        try:
            self._send_curve(address, [m.dumps(m.make(MsgType.BULK_OPEN, rid, route=ident.hex()))])
        except Exception as exc:  # noqa: BLE001 - no session then: CURVE carries everything
            log.debug("could not ask %s for a bulk session: %s", address, exc)
            del self._asked[address]
            self._retry_at[address] = time.monotonic() + self.RETRY_S
            return False
        return True

    def usable(self, address: str) -> bool:
        """Whether a message to ``address`` would go through its session now (a session found
        dead is given up)."""
        link = self._links.get(address)
        if link is None:
            return False
        if link.usable():
            return True
        if link.dead:
            self._give_up(address, link)
        return False

    def sessions(self) -> int:
        """Sessions open (usable or still connecting)."""
        return len(self._links)

    def drop(self, address: str) -> None:
        """Close the session with ``address`` (its CURVE connection is closed): one is asked again
        the next time it is needed."""
        link = self._links.pop(address, None)
        if link is not None:
            link.close()
        self._asked.pop(address, None)
        self._retry_at.pop(address, None)
        self._settle(address)

    def intercept(self, address: str, frames: list) -> bool:
        """True when ``frames`` (a message from ``address`` over CURVE) was the answer to this
        client's ``bulk_open`` (consumed here); a message with a large frame from a server without
        a session makes this client ask for one."""
        head = frames[0].bytes if isinstance(frames[0], zmq.Frame) else frames[0]
        if b'"bulk_opened"' in head[:48]:
            self._opened(address, head)
            return True
        if b'"type":"error","id":"bulk-' in head[:64]:
            return self._refused(address, head)
        if len(frames) > 1 and address not in self and _has_big(frames[1:]):
            self.ask(address)
        return False

    def _refused(self, address: str, head: bytes) -> bool:
        """The server's error answer to this client's ``bulk_open`` (a limit): CURVE carries its
        messages, and a session is asked again after :attr:`RETRY_S`."""
        from ..core import messages as m
        asked = self._asked.get(address)
        try:
            _, h = m.parse_header(head)
        except ProtocolError:
            return False
        if asked is None or h["id"] != asked[0]:
            return False
        del self._asked[address]
        self._retry_at[address] = time.monotonic() + self.RETRY_S
        log.info("%s refused a bulk session (%s): CURVE carries the messages", address,
                 (h.get("error") or {}).get("message"))
        self._settle(address)
        return True

    def _opened(self, address: str, head: bytes) -> None:
        from ..core import messages as m
        asked = self._asked.get(address)
        try:
            _, h = m.parse_header(head)
        except ProtocolError as exc:
            log.warning("bad bulk_opened from %s: %s", address, exc)
            return
        if asked is None or h["id"] != asked[0]:
            return                          # not the answer to this client's question: ignored
        del self._asked[address]
        old = self._links.pop(address, None)
        if old is not None:
            old.close()
        self._links[address] = BulkClient(address, h, asked[1], functools.partial(self._delivered, address),
                                          self._buffers, functools.partial(self._settle, address))

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()
        self._asked.clear()
        for address in list(self._waiting):
            self._settle(address)
