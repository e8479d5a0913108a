"""A zmq socket driven by the asyncio loop, draining in batches.

pyzmq's asyncio sockets pay a future per message. Here the raw socket's file
descriptor is watched with ``loop.add_reader``; on each wake-up every queued
message is drained (until ``EAGAIN``) and handed to a plain callback. This
batching is what more than doubles throughput (docs/performance.md).

zmq's FD is edge-triggered and a *send* may consume the edge, so after sends
we schedule one more drain check. Sends never block: ``NOBLOCK`` and
``EAGAIN`` is reported as :class:`~gridrpc.errors.CommunicationError`.

Frames of 64 KiB and more are sent zero-copy.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import socket as _socket
import time
from typing import Callable, Sequence

import zmq

from ..errors import CommunicationError

log = logging.getLogger(__name__)
ZERO_COPY_THRESHOLD = 64 * 1024
#: how long a peer has to complete its handshake on a bound socket (milliseconds)
HANDSHAKE_MS = 5000


def frame_size(f) -> int:
    """A frame's bytes: ``len`` of a memoryview of a 2-D array counts its rows, ``nbytes`` its bytes."""
    return f.nbytes if isinstance(f, memoryview) else len(f)


def has_big(frames) -> bool:
    """Whether any frame is large enough to go zero-copy (and, being large,
    to go alone rather than inside a batch)."""
    return any(frame_size(f) >= ZERO_COPY_THRESHOLD for f in frames
               if not isinstance(f, zmq.Frame)) if frames else False

#: messages handled per wake-up of one socket before the loop runs others
#: (timers, heartbeats, other sockets): a flooded socket cannot starve them
DRAIN_BATCH = 256
#: seconds of handling per wake-up of one socket, whatever the count: with a backlog of costly
#: messages from a flooding peer, 256 of them take tens of ms, and what the loop does between two
#: wake-ups waits that long (a worker's result, another socket such as a bulk session's; a SeD
#: starts the calls admitted in a wake-up at its end)
DRAIN_SECONDS = 0.002
_ctx: zmq.Context | None = None


def context() -> zmq.Context:
    global _ctx
    if _ctx is None or _ctx.closed:
        _ctx = configure_context(zmq.Context())
    return _ctx


def configure_context(ctx):
    """Options every gridrpc context gets (also the green one of the load tests)."""
    ctx.setsockopt(zmq.LINGER, 0)
    try:
        ctx.set(zmq.MAX_SOCKETS, 65536)
    except zmq.ZMQError:  # pragma: no cover
        pass
    return ctx


def format_tcp(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


def host_of(address: str) -> str:
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0]


def bind_router(address: str, *, mandatory: bool = True,
                options: dict | None = None) -> tuple[zmq.Socket, str]:
    """Bind a ROUTER; ``tcp://host:0`` picks a free port. ``options``: more
    socket options set before bind (e.g. CURVE, MAXMSGSIZE). Returns (socket,
    bound address)."""
    if address.startswith("tcp://") and address.endswith(":0"):
        address = address[:-2] + ":*"
    sock = context().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if mandatory:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    # a connection that has not completed its ZMTP (and CURVE) handshake in this time is closed:
    # idle connections before authentication cannot hold descriptors for long
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
    # No ZMQ heartbeats on the bound side: with a bounded receive queue, libzmq
    # 4.3.5 aborts ("Assertion failed: !_io_error", stream_engine_base.cpp)
    # when a heartbeat timer fires on a connection whose input was stopped by
    # the high-water mark. Connecting sides keep them (their queues are
    # unbounded); the tree's own heartbeats detect dead children.
    for opt, value in (options or {}).items():
        sock.setsockopt(opt, value)
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        sock.close()
        raise CommunicationError(f"cannot bind {address}: {exc}") from exc
    bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    if bound.startswith("tcp://0.0.0.0:"):
        bound = format_tcp(_socket.gethostname(), int(bound.rsplit(":", 1)[1]))
    return sock, bound


def routing_id() -> bytes:
    """A random routing id for a DEALER: the peer's ROUTER sees the same id
    across TCP reconnects (ROUTER_HANDOVER), so a call's owner, a child's
    place in the tree, survive a network blip; 120 random bits cannot be
    guessed by a stranger."""
    import os
    return b"g" + os.urandom(15)


def connect_dealer(address: str, identity: bytes | None = None, immediate: bool = False,
                   options: dict | None = None,
                   before_connect: "Callable[[zmq.Socket], None] | None" = None) -> zmq.Socket:
    """A DEALER connected to ``address``. ``immediate``: queue messages only on
    completed connections (sends fail at once while the peer is absent).
    ``options``: more socket options set before connect (e.g. CURVE).
    ``before_connect``: called with the socket just before it connects (a
    monitor must be attached then to see the first handshake)."""
    sock = context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100000)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    _heartbeat_opts(sock)
    sock.setsockopt(zmq.IDENTITY, identity or routing_id())
    if immediate:
        sock.setsockopt(zmq.IMMEDIATE, 1)
    for opt, value in (options or {}).items():
        sock.setsockopt(opt, value)
    if before_connect is not None:
        before_connect(sock)
    try:
        sock.connect(address)
    except zmq.ZMQError as exc:
        sock.close()
        raise CommunicationError(f"cannot connect to {address}: {exc}") from exc
    return sock


def _heartbeat_opts(sock: zmq.Socket) -> None:
    # transport-level liveness: detects half-open TCP (partitions) and reconnects
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
    sock.setsockopt(zmq.HEARTBEAT_TTL, 6000)


class Channel:
    """Wraps one socket: ``on_message(frames)`` is called for each message
    (frames are ``zmq.Frame`` objects; routing ids included for ROUTER)."""

    def __init__(self, sock: zmq.Socket, on_message: Callable[[list], None],
                 loop: asyncio.AbstractEventLoop | None = None, name: str = "",
                 around_drain: tuple[Callable[[], None], Callable[[], None]] | None = None) -> None:
        self.sock = sock
        self.on_message = on_message
        #: ``(begin, end)`` around the messages of one wake-up (begin before the first)
        self.around_drain = around_drain
        self.loop = loop or asyncio.get_running_loop()
        self.name = name
        self._fd = sock.getsockopt(zmq.FD)
        self._check_scheduled = False
        self._draining = False
        self.closed = False
        #: set by a handler to end the current drain after this message (the rest waits for the
        #: next loop iteration): a SeD lets its started calls reach their workers during a burst
        self.end_drain = False
        self.loop.add_reader(self._fd, self._drain)
        self._schedule_check()

    def send(self, frames: Sequence) -> None:
        if self.closed:
            raise CommunicationError(f"channel {self.name} is closed")
        big = has_big(frames)
        try:
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=not big)
        except zmq.Again as exc:
            raise CommunicationError(f"{self.name}: peer not reachable (send would block)") from exc
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise CommunicationError(f"{self.name}: peer gone") from exc
            raise CommunicationError(f"{self.name}: send failed: {exc}") from exc
        finally:
            if not self._draining:      # a drain in progress reads until EAGAIN anyway
                self._schedule_check()

    def _schedule_check(self) -> None:
        if not self._check_scheduled and not self.closed:
            self._check_scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Handle what the socket holds, within :data:`DRAIN_BATCH` messages and
        :data:`DRAIN_SECONDS`, with the cyclic GC paused: a message decoded into hundreds of
        objects (a deeply nested header, refused just after) would otherwise start collections
        in the middle of its decoding, which promote its still-live objects towards the oldest
        generation and so bring full collections of the daemon's whole heap (tens of ms each)
        every few thousand messages. Paused, what a message allocates and frees costs no
        collection; what it keeps counts towards the next one, which runs at the first
        allocation after the drain."""
        self._check_scheduled = False
        sock = self.sock
        self._draining = True
        hooks, began = self.around_drain, False
        clock = time.perf_counter
        until = clock() + DRAIN_SECONDS
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            for _ in range(DRAIN_BATCH):    # bounded so one busy socket cannot starve the loop
                if self.closed:
                    return
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                except zmq.ZMQError as exc:
                    log.warning("%s: receive failed: %s", self.name, exc)
                    return
                try:
                    if hooks is not None and not began:
                        began = True
                        hooks[0]()
                    self.on_message(frames)
                except Exception:  # a handler bug must not kill the daemon
                    log.exception("%s: error while handling a message", self.name)
                if self.end_drain:
                    self.end_drain = False
                    break
                if clock() > until:         # the rest at the next loop iteration (_schedule_check)
                    break
        finally:
            if collecting:
                gc.enable()
            self._draining = False
            if began:
                try:
                    hooks[1]()
                except Exception:  # noqa: BLE001 - same rule as a handler
                    log.exception("%s: error after a batch of messages", self.name)
        self._schedule_check()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.loop.remove_reader(self._fd)
        except Exception:  # pragma: no cover - loop already closed
            pass
        self.sock.close(linger=0)
