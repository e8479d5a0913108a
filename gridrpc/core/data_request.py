"""A request for data to the SeDs that hold it, as a state machine without I/O.

Clients (``DataRef.get``, ``put``, ``free``, ``replicate``) and SeDs
(fetching a call's arguments, replicating) ask a holder SeD for data the
same way, and this machine is that way:

- the request goes to the first holder (:class:`Send`, with a fresh id);
- while no answer comes, the holder is pinged every ``poll`` seconds
  (:class:`Ping`: ``PING`` with ``ids=[]``, answered by any live SeD), and
  anything heard from its address counts as a sign of life;
- a holder silent for ``silence`` seconds, or without an answer after
  ``timeout`` seconds, is given up (:class:`GiveUp`); so is a holder without
  an address, one the runtime could not send to (:class:`Unreachable`),
  and one whose error answer ``retry`` accepts: then the next holder is asked;
- the first answer that is not such an error ends the request
  (:class:`Done`); a final error answer, or the last holder given up, ends it
  with :class:`Failed`, which lists every holder given up and why.

An answer to an earlier holder's request (that holder was given up) is ignored.

One way in: ``handle(event, now) -> list[action]``, the events being
:class:`Start`, :class:`Answer`, :class:`Unreachable` and :class:`Tick` (due
at :meth:`~DataRequest.next_wakeup`); ``now`` is in seconds on any monotonic
clock; the actions are to be carried out in order. Ids come from the
``new_id`` callable given at construction. The runtime is
:mod:`gridrpc.runtime.data_request`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

__all__ = ["DataRequest", "Start", "Answer", "Unreachable", "Tick", "Event", "Send", "Ping", "GiveUp", "Done",
           "Failed", "Action", "poll_interval"]


# -- events ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Start:
    """Ask the first holder."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer to request ``id``: ``error`` is its ``error`` field when it
    is an error answer, else ``None``."""
    id: str
    error: dict | None = None


@dataclass(frozen=True, slots=True)
class Unreachable:
    """The runtime could not send request ``id`` (or a ping) to its holder: ``why``."""
    id: str
    why: str


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; ``heard``: when anything last came from the current
    holder's address (``None``: never)."""
    heard: float | None = None


Event = Start | Answer | Unreachable | Tick


# -- actions --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send the request, under ``id``, to holder ``name`` at ``address``."""
    id: str
    name: str
    address: str


@dataclass(frozen=True, slots=True)
class Ping:
    """Send ``PING`` with ``ids=[]`` and id ``id`` to ``address``: is the holder alive?"""
    id: str
    address: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Holder ``name`` (``address``; request ``id``, ``""`` when none was sent)
    is given up: ``why`` says why; ``error`` is its error answer, if it gave one."""
    id: str
    name: str
    address: str
    why: str
    error: dict | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """Holder ``name`` answered request ``id``: the runtime uses that answer."""
    id: str
    name: str
    address: str


@dataclass(frozen=True, slots=True)
class Failed:
    """The request failed: ``error`` is a final error answer (from holder
    ``name``), ``None`` when every holder was given up; ``given_up`` lists
    the holders given up before, in order."""
    given_up: tuple[GiveUp, ...]
    error: dict | None = None
    name: str = ""


Action = Send | Ping | GiveUp | Done | Failed


def poll_interval(silence: float) -> float:
    """How often a holder is pinged while an answer is awaited: three pings
    within ``silence``, at least one a second."""
    return min(1.0, silence / 3)


class DataRequest:
    """One request for data, to ``holders`` (``(name, address)`` pairs, asked
    in order until one answers).

    ``timeout``: how long one holder has to answer; ``silence``: how long it
    may stay silent (no answer, no reply to pings) before it is given up;
    ``retry(error)``: whether an error answer (its ``error`` field) gives the
    holder up and asks the next one (``None``: never; the error is final).
    """

    __slots__ = ("_holders", "_next", "_timeout", "_silence", "_poll", "_new_id", "_retry", "_given_up",
                 "_id", "_name", "_address", "_sent_at", "_wake", "finished")

    def __init__(self, holders: Iterable[tuple[str, str]], *, timeout: float, silence: float,
                 new_id: Callable[[], str], retry: Callable[[dict], bool] | None = None) -> None:
        if not timeout > 0 or not silence > 0:
            raise ValueError(f"timeout and silence must be positive, not {timeout!r}, {silence!r}")
        self._holders = [(str(n), str(a or "")) for n, a in holders]
        self._next = 0
        self._timeout = float(timeout)
        self._silence = float(silence)
        self._poll = poll_interval(self._silence)
        self._new_id = new_id
        self._retry = retry
        self._given_up: list[GiveUp] = []
        self._id = self._name = self._address = ""
        self._sent_at = self._wake = 0.0
        #: True once Done or Failed was returned: every later event returns nothing
        self.finished = False

    # -- what the runtime reads -------------------------------------------------------------------
    @property
    def current(self) -> tuple[str, str, str]:
        """``(request id, holder name, address)`` of the request awaiting an answer."""
        return self._id, self._name, self._address

    def next_wakeup(self) -> float | None:
        """When the runtime must call ``handle(Tick(...), now)`` next (``None`` once finished)."""
        return None if self.finished else self._wake

    # -- events -----------------------------------------------------------------------------------
    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply ``event`` at time ``now``; returns the actions to carry out, in order."""
        if self.finished:
            return []
        t = type(event)
        if t is Tick:
            return self._tick(event.heard, now)
        if t is Answer:
            return self._answer(event.id, event.error, now)
        if t is Unreachable:
            return self._give_up(now, event.why, None) if event.id == self._id else []
        if t is Start:
            return [] if self._next else self._ask_next(now, [])
        raise TypeError(f"not a DataRequest event: {event!r}")

    def _answer(self, id: str, error: dict | None, now: float) -> list[Action]:
        if id != self._id:
            return []                   # an earlier holder's late answer
        if error is None:
            self.finished = True
            return [Done(self._id, self._name, self._address)]
        if self._retry is not None and self._retry(error):
            return self._give_up(now, str(error.get("message") or error.get("kind") or "error"), error)
        self.finished = True
        return [Failed(tuple(self._given_up), error, self._name)]

    def _tick(self, heard: float | None, now: float) -> list[Action]:
        if now < self._wake:
            return []
        if now - self._sent_at > self._timeout:
            return self._give_up(now, f"did not answer within {self._timeout:g}s", None)
        last = self._sent_at if heard is None else max(self._sent_at, heard)
        if now - last > self._silence:
            return self._give_up(now, f"silent for {self._silence:.1f}s", None)
        self._wake = now + self._poll
        return [Ping(self._new_id(), self._address)]

    # -- transitions ------------------------------------------------------------------------------
    def _give_up(self, now: float, why: str, error: dict | None) -> list[Action]:
        g = GiveUp(self._id, self._name, self._address, why, error)
        self._given_up.append(g)
        return self._ask_next(now, [g])

    def _ask_next(self, now: float, out: list[Action]) -> list[Action]:
        while self._next < len(self._holders):
            name, address = self._holders[self._next]
            self._next += 1
            if not address:
                g = GiveUp("", name, "", "no address")
                self._given_up.append(g)
                out.append(g)
                continue
            self._id, self._name, self._address = self._new_id(), name, address
            self._sent_at, self._wake = now, now + self._poll
            out.append(Send(self._id, name, address))
            return out
        self.finished = True
        self._id = ""
        out.append(Failed(tuple(self._given_up)))
        return out
