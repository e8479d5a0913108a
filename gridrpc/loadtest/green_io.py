"""What the gevent load-test client (:mod:`gridrpc.loadtest.green`) runs on:
zmq sockets read from gevent's hub, never blocking (:class:`GreenSocket`),
and the call machine driven under gevent (:class:`GreenDriver`), where a
calling greenlet parks until its call ends.

A socket's messages are handled in a callback of the hub, drained until
``EAGAIN`` per wake-up: no greenlet switch per message, no ``zmq.green``
wrapper re-reading the socket's state after every frame."""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

import gevent
import gevent.event
import zmq

from ..client.driver import CallDriver, Flight
from ..client.ids import new_id
from ..core import codec
from ..core.client_call.machine import Tick
from ..errors import CommunicationError
from ..transport.channel import DRAIN_BATCH, ZERO_COPY_THRESHOLD, configure_context, routing_id

__all__ = ["GreenDriver", "GreenSocket", "context", "decode_answer"]

log = logging.getLogger("gridrpc.loadtest.green")
_ctx: zmq.Context | None = None
TICK = Tick()
_POLLIN = int(zmq.POLLIN)
_EVENTS = zmq.EVENTS
_NOBLOCK = zmq.NOBLOCK


def context() -> zmq.Context:
    """The process's zmq context of the load-test clients (separate from the asyncio one)."""
    global _ctx
    if _ctx is None or _ctx.closed:
        _ctx = configure_context(zmq.Context())
    return _ctx


class GreenSocket:
    """A DEALER that never blocks; what arrives is handed to ``on_message``
    from a callback of the gevent hub (its I/O watcher), drained until
    ``EAGAIN`` (at most ``DRAIN_BATCH`` messages per turn). zmq's descriptor
    is edge-triggered and a send may consume the edge: after every send the
    socket's ``EVENTS`` are read and a drain is scheduled when input waits."""

    __slots__ = ("sock", "address", "name", "on_message", "closed", "_watcher", "_loop", "_scheduled")

    def __init__(self, address: str, on_message, name: str) -> None:
        s = context().socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, routing_id())    # stable across reconnects (the SeD's owner check)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100000)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.RECONNECT_IVL, 100)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        s.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        try:
            s.connect(address)
        except zmq.ZMQError as exc:
            s.close()
            raise CommunicationError(f"cannot connect to {address}: {exc}") from exc
        self.sock, self.address, self.name = s, address, name
        self.on_message = on_message
        self.closed = False
        self._scheduled = False
        self._loop = gevent.get_hub().loop
        self._watcher = self._loop.io(s.getsockopt(zmq.FD), 1)
        self._watcher.start(self._drain)
        self._check()

    def send(self, frames: list) -> None:
        if self.closed:
            raise CommunicationError(f"{self.name}: socket closed")
        try:
            if len(frames) == 1:
                self.sock.send(frames[0], _NOBLOCK)
            else:
                big = any(len(f) >= ZERO_COPY_THRESHOLD for f in frames)
                self.sock.send_multipart(frames, flags=_NOBLOCK, copy=not big)
        except zmq.Again as exc:
            raise CommunicationError(f"{self.name}: peer not reachable (send would block)") from exc
        except zmq.ZMQError as exc:
            raise CommunicationError(f"{self.name}: send failed: {exc}") from exc
        self._check()

    def _check(self) -> None:
        """Input waiting (the send may have taken the descriptor's edge): drain it soon."""
        if not self._scheduled and self.sock.getsockopt(_EVENTS) & _POLLIN:
            self._scheduled = True
            self._loop.run_callback(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        if self.closed:
            return
        recv, handle = self.sock.recv_multipart, self.on_message
        for _ in range(DRAIN_BATCH):
            try:
                frames = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            try:
                handle(frames)
            except Exception:  # noqa: BLE001 - a bug here must not stop the socket
                log.exception("%s: error while handling a message", self.name)
            if self.closed:
                return
        self._scheduled = True                  # more waiting: another turn, after the others
        self._loop.run_callback(self._drain)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._watcher.stop()
        self._watcher.close()
        self.sock.close(linger=0)


class GreenDriver(CallDriver):
    """The call machine under gevent: the calling greenlet waits on an event,
    set by the outcome or by a wakeup that moved earlier; the sockets'
    callbacks feed the replies. ``socket_for(address)``: the socket to a
    server; ``on_attempt``, ``on_discover``: the client's hooks
    (:class:`~gridrpc.client.driver.CallDriver`)."""

    def __init__(self, socket_for: Callable[[str], "GreenSocket"], *, on_attempt, on_discover) -> None:
        super().__init__(clock=time.monotonic, new_id=new_id, decode=decode_answer, name="green client",
                         on_attempt=on_attempt, on_discover=on_discover)
        self.socket_for = socket_for

    def send(self, address: str, frames: list) -> None:
        self.socket_for(address).send(frames)

    def _prepare(self, flight: Flight) -> None:
        flight.waiter = gevent.event.Event()

    def _arm(self, flight: Flight) -> None:
        until = flight.waiting_until
        if until is not None:
            w = flight.machine.next_wakeup()
            if w is not None and w < until:
                flight.waiter.set()             # wake the caller: it waits for a later time

    def _finish(self, flight: Flight, outcome) -> None:
        flight.outcome = outcome
        flight.waiter.set()

    def wait(self, flight: Flight):
        """Park the calling greenlet until the call ends; its outcome."""
        waiter, machine, clock = flight.waiter, flight.machine, self.clock
        try:
            while flight.outcome is None:
                w = machine.next_wakeup()
                flight.waiting_until = math.inf if w is None else w
                waiter.clear()
                waiter.wait(None if w is None else max(0.0, w - clock()))
                flight.waiting_until = None
                if flight.outcome is None:
                    self.feed(flight, TICK)
        except BaseException:                   # killed, gevent.Timeout...: CANCEL to the server
            flight.waiting_until = None
            self.abandon(flight)
            raise
        return flight.outcome


def decode_answer(header: dict, frames: list) -> tuple[Any, int]:
    """An answer's value and the bytes of its frames."""
    size = 0
    for f in frames:
        size += len(f)
    if len(frames) == 1:
        return codec.decode(header.get("value"), ()), size
    return codec.decode(header.get("value"), [f.buffer for f in frames[1:]]), size
