"""Drivers of the call machine (:mod:`gridrpc.core.client_call.machine`).

A driver owns sockets, timers and whatever a caller waits on; the machine
owns every protocol rule. :class:`CallDriver` is the part shared by all
drivers — request ids to calls, replies turned into events, actions carried
out — and :class:`AsyncCallDriver` adds asyncio: one timer per call at its
``next_wakeup()``, pings batched per address, a future per call resolved with
the machine's :class:`~gridrpc.core.client_call.machine.Done` or
:class:`~gridrpc.core.client_call.machine.Fail`. The asyncio client and the relay to remote
SeDs (cloud VMs, pilots) use it; the gevent load-test client subclasses :class:`CallDriver` with
greenlet waits (:mod:`gridrpc.loadtest.green`).

The transport is a function ``send(address, frames)`` raising a
:class:`~gridrpc.errors.GridRPCError` when the frames cannot leave; the
owner calls :meth:`CallDriver.on_message` with what each server sends.
"""
from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Callable

from ..core import messages as m
from ..core.client_call.machine import (Abort, Cancel, CallError, CallMachine, Discover, DiscoveryFailed, Done, Fail,
                                        FailOver, Malformed, SendCall, SendCancel, SendFailed, SendPing, Start, Tick)
from ..core.client_call.replies import pong_events, reply_event
from ..core.client_call.vocabulary import Phase
from ..core.messages import MsgType
from ..core.tally import tally
from ..transport.channel import has_big
from ..errors import GridRPCError, ProtocolError, error_from_wire

log = logging.getLogger(__name__)

__all__ = ["Flight", "CallDriver", "AsyncCallDriver", "exception_for"]

_START, _TICK, _CANCEL = Start(), Tick(), Cancel()
#: timers of calls are grouped in slots of this many seconds (a wakeup is at most this late)
TIMER_SLOT = 0.005


def exception_for(error: CallError) -> GridRPCError:
    """The :mod:`gridrpc.errors` exception users see for a failed call."""
    return error_from_wire(error.to_wire(), server=error.server)


class Flight:
    """One call in flight: its machine, the CALL header (its ``id``/``sed``
    are set per attempt) and binary frames, what its caller waits on
    (``waiter``), and the caller's ``context`` (a :class:`gridrpc.Call`).
    ``on_end(flight)``, if given instead of a waiter, is called once when the
    call ends (a submitted call without a task: no future and no callback of
    its own, gridrpc.client.submit; :class:`AsyncCallDriver` only)."""

    __slots__ = ("machine", "header", "buffers", "context", "waiter", "timer", "outcome", "waiting_until", "at",
                 "on_end")

    def __init__(self, machine: CallMachine, header: dict, buffers: list, context: Any = None) -> None:
        self.machine, self.header, self.buffers, self.context = machine, header, buffers, context
        self.waiter: Any = None
        self.timer: Any = None
        self.outcome: Done | Fail | None = None
        self.waiting_until: float | None = None
        self.at: str | None = None      # the address it is counted at (AsyncCallDriver.at_address)
        self.on_end: Callable[[Flight], None] | None = None


class CallDriver:
    """Transport-independent part of a driver. ``clock()``: monotonic
    seconds; ``new_id()``: request ids for pings; ``decode(header, frames)``:
    the value of a RESULT (raises on a bad one); ``on_attempt(flight,
    action)``: told of every CALL sent."""

    def __init__(self, *, clock: Callable[[], float], new_id: Callable[[], str],
                 decode: Callable[[dict, list], Any], name: str = "client",
                 on_attempt: Callable[[Flight, SendCall], None] | None = None,
                 on_discover: Callable[[Flight, Discover], Any] | None = None) -> None:
        self.clock, self.new_id, self.decode, self.name = clock, new_id, decode, name
        self.on_attempt = on_attempt
        # starts a discovery; its owner feeds Discovered / DiscoveryFailed later, or returns one at once
        self.on_discover = on_discover
        self.flights: dict[str, Flight] = {}        # request id -> its call (every attempt not forgotten)
        self.discovering: set[Flight] = set()       # calls still looking for servers (no request id yet)

    # -- to provide -------------------------------------------------------------------------
    def send(self, address: str, frames: list) -> None:
        raise NotImplementedError

    def _arm(self, flight: Flight) -> None:
        """The machine's next wakeup may have changed."""

    def _disarm(self, flight: Flight) -> None:
        """The call is over or forgotten: drop its timer."""

    def _finish(self, flight: Flight, outcome: Done | Fail) -> None:
        flight.outcome = outcome

    # -- the caller's side ------------------------------------------------------------------
    def launch(self, machine: CallMachine, header: dict, buffers: list, context: Any = None,
               on_end: Callable[[Flight], None] | None = None) -> Flight:
        flight = Flight(machine, header, buffers, context)
        flight.on_end = on_end
        self._prepare(flight)
        self.feed(flight, _START)
        return flight

    def _prepare(self, flight: Flight) -> None:
        """Create what the caller waits on (before the first event)."""

    def cancel(self, flight: Flight) -> None:
        """The user cancels: CANCEL to the server; the call ends when it confirms."""
        self.feed(flight, _CANCEL)

    def abandon(self, flight: Flight) -> None:
        """The caller stopped waiting (task cancelled, greenlet killed): the
        server gets a CANCEL and the call is forgotten."""
        if not flight.machine.finished:
            self.feed(flight, _CANCEL)
        self._forget(flight)
        self._disarm(flight)

    def abort_all(self, message: str, kind: str = "communication") -> None:
        """Fail every call in flight (client closed, VM gone); each server gets a CANCEL."""
        for flight in list(dict.fromkeys([*self.flights.values(), *self.discovering])):
            self.feed(flight, Abort(kind, message))

    # -- events -----------------------------------------------------------------------------
    def feed(self, flight: Flight, event: Any, now: float | None = None) -> None:
        machine = flight.machine
        actions = machine.handle(event, self.clock() if now is None else now)
        while actions:
            follow = None
            for a in actions:
                t = type(a)
                if t is SendCall:
                    follow = self._send_call(flight, a)
                elif t is SendPing:
                    self._ping(a)
                elif t is SendCancel:
                    self._cancel(a)
                elif t is Discover:
                    self.discovering.add(flight)
                    if self.on_discover is None:
                        follow = DiscoveryFailed("no_server", "this driver cannot discover servers")
                    else:                   # an answer at once (kept from an earlier one), or later
                        follow = self.on_discover(flight, a)
                elif t is FailOver:
                    if self.flights.get(a.id) is flight:
                        del self.flights[a.id]
                    log.log(logging.DEBUG if a.routine else logging.WARNING, "%s: call %s of %s: %s %s; trying %s",
                            self.name, a.id, machine.service, a.server, a.reason, a.next_server)
                else:                                   # Done / Fail
                    self._forget(flight)
                    self._disarm(flight)
                    self._finish(flight, a)
            actions = machine.handle(follow, self.clock()) if follow is not None else None
        if not machine.finished:
            self._arm(flight)

    def on_message(self, address: str, frames: list, in_batch: bool = False) -> None:
        """A message from the server at ``address`` (``frames[0]`` the header)."""
        try:
            mt, h = m.parse_header(frames[0].bytes if hasattr(frames[0], "bytes") else frames[0])
            if mt is MsgType.BATCH:         # a server's answers to a batch of ours, in order
                if in_batch:
                    raise ProtocolError("a batch cannot hold a batch")
                for part in m.unbatch(h, list(frames[1:])):
                    self.on_message(address, part, in_batch=True)
                return
        except ProtocolError as exc:
            log.warning("%s: bad message from %s: %s", self.name, address, exc)
            for flight in list(dict.fromkeys(self.flights.values())):
                if flight.machine.address == address:
                    self.feed(flight, Malformed(str(exc)))
            return
        if mt is MsgType.PONG:
            for pong in pong_events(h):
                flight = self.flights.get(pong.id)
                if flight is not None:
                    self.feed(flight, pong)
            return
        cid = h["id"]
        flight = self.flights.get(cid)
        if flight is None:
            return                      # late answer to a call given up, cancel ack of a forgotten call
        if mt is MsgType.RESULT:
            try:
                value = self.decode(h, frames)
            except Exception as exc:  # noqa: BLE001 - whatever a bad result raises fails this call only
                log.warning("%s: undecodable result of %s from %s: %r", self.name, cid, address, exc)
                self.feed(flight, Malformed(f"undecodable result: {exc}", cid))
                return
            event: Any = reply_event(mt, h, value)
        else:
            event = reply_event(mt, h, reply=(mt, h, list(frames[1:])) if mt is MsgType.ERROR else None)
        self.feed(flight, event)

    # -- actions ----------------------------------------------------------------------------
    def _send_call(self, flight: Flight, a: SendCall) -> SendFailed | None:
        try:
            self.send(a.address, self._call_frames(flight, a))
        except GridRPCError as exc:
            return SendFailed(str(exc))
        return None

    def _call_frames(self, flight: Flight, a: SendCall) -> list:
        self.flights[a.id] = flight
        if self.on_attempt is not None:
            self.on_attempt(flight, a)
        h = flight.header
        h["id"] = a.id
        if a.server:
            h["sed"] = a.server
        else:
            h.pop("sed", None)
        if a.start_now:
            h["start_now"] = True
        else:
            h.pop("start_now", None)
        return [m.dumps(h), *flight.buffers]

    def _ping(self, a: SendPing) -> None:
        self._send_pings(a.address, [a.id])

    def _send_pings(self, address: str, ids: list[str]) -> None:
        try:
            self.send(address, [m.dumps(m.make(MsgType.PING, self.new_id(), ids=ids))])
        except GridRPCError:
            pass                        # silence is the machine's business

    def _cancel(self, a: SendCancel) -> None:
        try:
            self.send(a.address, [m.dumps(self._cancel_header(a))])
        except GridRPCError as exc:
            log.info("%s: CANCEL of %s to %s not sent: %s", self.name, a.id, a.server, exc)

    @staticmethod
    def _cancel_header(a: SendCancel) -> dict:
        return m.make(MsgType.CANCEL, a.id, sed=a.server) if a.server else m.make(MsgType.CANCEL, a.id)

    def _forget(self, flight: Flight) -> None:
        self.discovering.discard(flight)
        for i in flight.machine.attempts:
            if self.flights.get(i) is flight:
                del self.flights[i]


class AsyncCallDriver(CallDriver):
    """The asyncio driver: ``flight.waiter`` is a future resolved with the
    outcome (never with an exception), or ``flight.on_end`` is called with the
    flight when it ends; one ``loop.call_at`` timer per call;
    pings of one loop iteration go out as one PING per address.

    CALLs and CANCELs made in one loop iteration wait in a per-server outbox
    and leave together at its end: one message when there is one, else one
    BATCH envelope of up to ``MAX_BATCH`` (a burst of thousands of calls to
    two SeD processes is a few hundred zmq messages, not one per call). Order per server
    is kept (a CANCEL never overtakes its CALL). A call whose batch cannot
    leave gets ``SendFailed`` then, as it would have at once. Arguments of
    64 KiB and more go alone, after what is queued for that server.
    To a server where this client has ``LINGER_CALLS`` calls in flight
    (``at_address``), the outbox waits up to ``LINGER_S`` for more
    (:func:`gridrpc.core.messages.linger`): a client keeping 256 calls in
    flight sends one batch per millisecond instead of a CALL per answer.
    ``batching=False``: every message at once, as the base driver."""

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Callable[[str, list], None], *,
                 batching: bool = True, **kw: Any) -> None:
        super().__init__(clock=loop.time, **kw)
        self.loop = loop
        self.send = send                                    # type: ignore[method-assign]
        self.batching = batching
        self._pings: dict[str, list[str]] = {}
        self._outbox: dict[str, list[tuple[list, Flight | None, str]]] = {}
        self._slots: dict[float, dict[Flight, None]] = {}     # timer slot -> the calls waking then
        self.at_address: dict[str, int] = {}    # calls in flight per server address
        self._soon = False                      # a flush of the outbox is due at this iteration's end

    def busy(self) -> bool:
        """Whether a call is in flight or discovering, or a message waits in
        an outbox (CALLs and CANCELs to batch) or among the pings to send."""
        return bool(self.flights or self.discovering or self._outbox or self._pings)

    async def wait(self, flight: Flight) -> Done | Fail:
        """The outcome of ``flight``; a caller cancelled while it waits
        abandons the call (a CANCEL to the server)."""
        try:
            return await flight.waiter
        except asyncio.CancelledError:
            self.abandon(flight)
            raise

    def _send_call(self, flight: Flight, a: SendCall) -> SendFailed | None:
        if not self.batching:
            return super()._send_call(flight, a)
        frames = self._call_frames(flight, a)
        alone = self.at_address[a.address] == 1 and a.address not in self._outbox
        if alone or has_big(flight.buffers):
            # the only call in flight there (a sequential caller: nothing to batch it with, and
            # waiting for the loop iteration's end cost it an iteration), or big arguments
            self._flush_address(a.address)
            try:
                self.send(a.address, frames)
            except GridRPCError as exc:
                return SendFailed(str(exc))
            return None
        self._queue(a.address, frames, flight, a.id)
        return None

    def _cancel(self, a: SendCancel) -> None:
        if not self.batching:
            return super()._cancel(a)
        self._queue(a.address, [m.dumps(self._cancel_header(a))], None, a.id)

    def _call_frames(self, flight: Flight, a: SendCall) -> list:
        if flight.at != a.address:
            if flight.at is not None:
                tally(self.at_address, flight.at, -1)
            flight.at = a.address
            tally(self.at_address, a.address, 1)
        return super()._call_frames(flight, a)

    def _forget(self, flight: Flight) -> None:
        if flight.at is not None:
            tally(self.at_address, flight.at, -1)
            flight.at = None
        super()._forget(flight)

    def _queue(self, address: str, frames: list, flight: Flight | None, attempt: str) -> None:
        q = self._outbox.get(address)
        if q is None:
            q = self._outbox[address] = []
            delay = m.linger(self.at_address.get(address, 0))
            if delay > 0:
                self.loop.call_later(delay, self._flush_address, address)
            elif not self._soon:
                self._soon = True
                self.loop.call_soon(self.flush)
        q.append((frames, flight, attempt))
        if len(q) >= m.MAX_BATCH:
            self._flush_address(address)

    def flush(self) -> None:
        """Send everything in the outbox now (the client calls it before closing)."""
        self._soon = False
        for address in list(self._outbox):
            self._flush_address(address)

    def _flush_address(self, address: str) -> None:
        q = self._outbox.pop(address, None)
        if not q:
            return
        try:
            self.send(address, m.packed([frames for frames, _, _ in q]))
        except GridRPCError as exc:
            log.info("%s: %d message(s) to %s not sent: %s", self.name, len(q), address, exc)
            for _, flight, attempt in q:
                mc = flight.machine if flight is not None else None
                if mc is not None and not mc.finished and mc.id == attempt and mc.phase is Phase.WAITING:
                    self.feed(flight, SendFailed(str(exc)))

    def _prepare(self, flight: Flight) -> None:
        if flight.on_end is None:
            flight.waiter = self.loop.create_future()

    def _arm(self, flight: Flight) -> None:
        """Timers share slots of ``TIMER_SLOT`` seconds: a call's wakeup is
        rounded up to its slot and one loop timer serves every call of the slot
        (14,000 calls pinging each second were 14,000 heap entries and most of
        a client's time; now ~1 timer per slot)."""
        w = flight.machine.next_wakeup()
        t = flight.timer                # the slot it waits in
        if t is not None:
            if w is not None and t <= w:
                return                  # fires early: the tick is a no-op and re-arms
            slot = self._slots.get(t)
            if slot is not None:
                slot.pop(flight, None)
        if w is None:
            flight.timer = None
            return
        t = flight.timer = math.ceil(w / TIMER_SLOT) * TIMER_SLOT
        slot = self._slots.get(t)
        if slot is None:
            slot = self._slots[t] = {}
            self.loop.call_at(t, self._on_slot, t)
        slot[flight] = None

    def _on_slot(self, t: float) -> None:
        slot = self._slots.pop(t, None)
        if not slot:
            return
        now = max(self.loop.time(), t)
        for flight in slot:
            flight.timer = None
            if not flight.machine.finished:
                self.feed(flight, _TICK, now)

    def _disarm(self, flight: Flight) -> None:
        if flight.timer is not None:
            slot = self._slots.get(flight.timer)
            if slot is not None:
                slot.pop(flight, None)
            flight.timer = None

    def _finish(self, flight: Flight, outcome: Done | Fail) -> None:
        flight.outcome = outcome
        waiter = flight.waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(outcome)
        elif flight.on_end is not None:
            end, flight.on_end = flight.on_end, None
            end(flight)

    def _ping(self, a: SendPing) -> None:
        if not self._pings:
            self.loop.call_soon(self._flush_pings)
        self._pings.setdefault(a.address, []).append(a.id)

    def _flush_pings(self) -> None:
        self.flush()                    # a PING never overtakes the CALL it asks about
        pings, self._pings = self._pings, {}
        for address, ids in pings.items():
            self._send_pings(address, ids)

