"""The life of a call on a SeD (pure): one record per request id.

::

    queued ──Start──▶ running ──answer──▶ finished | failed
      │                  │
      cancel             ├─cancel──▶ cancelled
      ▼                  └─preempted─▶ killed
    cancelled

:class:`SedCalls` holds every call a SeD process has seen, whatever replica
it is for: the live ones (queued, running) as :class:`CallRecord`\\ s, the
finished ones as ids with, within a byte bound, their answer
(:class:`~gridrpc.core.result_cache.ResultCache`). It wraps the replicas'
:class:`~gridrpc.core.queue.SedScheduler`\\ s and turns their Start/Kill into
actions on records. Because live and finished calls are one table, a request
id is never run twice, and a repeated id always gets an answer:

- of a queued or running call: :class:`Reacknowledge` (ACCEPTED again);
- of a finished call whose answer is kept: :class:`Resend`;
- whose answer the back-end holds (batch: on disk): :class:`Fetch`;
- whose answer was dropped to respect the byte bound: :class:`Expired`
  (an error saying the result is gone, never a second run).

The runtime applies the actions: :class:`Run` (execute), :class:`Stop` (kill
a running call and answer it), :class:`Drop` (answer a call cancelled while
queued). Times (``now``) are arguments; nothing here does I/O.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from .queue import Kill, Request, SedScheduler, Start
from .result_cache import DEFAULT_MAX_BYTES, DEFAULT_MAX_IDS, ResultCache


#: the share of the client's ``ack_timeout`` (sent as ``ack_ms`` in the CALL) a SeD may
#: wait before acknowledging a queued call, and the most it waits
ACK_SHARE = 0.05
ACK_DELAY_MAX = 0.25
#: held ACCEPTEDs are sent in slots of this many seconds (one timer per slot, one batch per client)
ACK_SLOT = 0.005
#: a read that admits this many calls lets the queues start work then, pauses again for the rest
#: of the message and ends the read after it (the next read comes at the next loop iteration, after
#: the started calls reached their workers): a burst of 100 users' batches (7,000 calls for one SeD
#: process) read at once kept every replica idle for the ~0.3 s the whole read took to admit
PAUSE_CALLS = 256
#: after a read of the socket whose cancels freed running slots, the next calls start this
#: much later (cancels of users sent together reach the SeD in several reads)
CANCEL_GRACE = 0.002


def ack_delay(base: float, starts: bool, idempotent: bool, ack_ms) -> float:
    """How long a SeD may hold the ACCEPTED of a call (0: send it now). Only
    back-ends that answer quickly hold it (``base`` > 0, the process back-end's
    20 ms) and only for idempotent services. A call that starts at once gets
    ``base``; a client that said how long it waits (``ack_ms``, validated at the
    boundary) lets a queued call wait ``ACK_SHARE`` of that, at most
    ``ACK_DELAY_MAX``: a queue that drains within it sends no ACCEPTED at all."""
    if base <= 0 or not idempotent:
        return 0.0
    delay = base if starts else 0.0
    if ack_ms is not None:
        delay = max(delay, min(float(ack_ms) / 1000.0 * ACK_SHARE, ACK_DELAY_MAX))
    return delay


__all__ = ["PAUSE_CALLS", "CANCEL_GRACE", "ack_delay", "CallState", "CallRecord", "SedCalls", "Run", "Stop", "Drop", "Reacknowledge", "Resend",
           "Fetch", "Expired", "DEFAULT_RESULT_CACHE_BYTES"]

DEFAULT_RESULT_CACHE_BYTES = DEFAULT_MAX_BYTES


class CallState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    KILLED = "killed"          # preempted by a mandatory call (ethic queue)


@dataclass(eq=False, kw_only=True)
class CallRecord:
    """One call while it is live. Runtimes subclass it with what they need
    (route, decoded arguments, task): the record stays one object."""
    id: str
    sed: str                   # the replica (element) it is for
    service: str
    user: str = "anonymous"
    optional: bool = False
    received: float = 0.0
    started: float | None = None
    ended: float | None = None
    state: CallState = CallState.QUEUED
    owner: object = None       # who made it (an authenticated key, else the connection); None: anyone


# -- actions ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Run:
    """Start executing the call."""
    call: CallRecord


@dataclass(frozen=True, slots=True)
class Stop:
    """Kill the running call and answer it (``reason``: cancelled | preempted)."""
    call: CallRecord
    reason: str


@dataclass(frozen=True, slots=True)
class Drop:
    """The call was cancelled before it started: answer it."""
    call: CallRecord


@dataclass(frozen=True, slots=True)
class Reacknowledge:
    """A repeated id of a live call: acknowledge again (the sender may have a new route)."""
    call: CallRecord


@dataclass(frozen=True, slots=True)
class Resend:
    """A repeated id of a finished call: send its answer again."""
    call_id: str
    frames: list


@dataclass(frozen=True, slots=True)
class Fetch:
    """The back-end holds the answer (``frames`` if also in memory): deliver it."""
    call_id: str
    frames: list | None


@dataclass(frozen=True, slots=True)
class Expired:
    """A repeated id of a finished call whose answer is no longer kept."""
    call_id: str


Action = Run | Stop | Drop
Duplicate = Reacknowledge | Resend | Fetch | Expired


class SedCalls:
    """Every call of a SeD process, by request id (see the module doc)."""

    def __init__(self, schedulers: Mapping[str, SedScheduler], *,
                 result_cache_bytes: int = DEFAULT_RESULT_CACHE_BYTES,
                 remember_ids: int = DEFAULT_MAX_IDS) -> None:
        self.schedulers = dict(schedulers)
        self.live: dict[str, CallRecord] = {}
        self.cache = ResultCache(result_cache_bytes, remember_ids)
        self.counts = {"submitted": 0, "finished": 0, "failed": 0, "cancelled": 0, "killed": 0,
                       "duplicates": 0, "expired": 0}
        self.paused = False                 # between pause() and resume()
        self._touched: set[str] = set()     # queues paused since

    # -- inputs ---------------------------------------------------------------
    def duplicate(self, call_id: str) -> Duplicate | None:
        """What to answer if ``call_id`` was seen before; None for a new call."""
        call = self.live.get(call_id)
        if call is not None:
            self.counts["duplicates"] += 1
            return Reacknowledge(call)
        cache = self.cache
        if call_id not in cache:
            return None
        self.counts["duplicates"] += 1
        frames = cache.answer(call_id)
        if cache.held(call_id):
            return Fetch(call_id, frames)
        if frames is not None:
            return Resend(call_id, frames)
        self.counts["expired"] += 1
        return Expired(call_id)

    def owned_by(self, call_id: str, who: object) -> bool:
        """May ``who`` (a key's identity, else a connection) ask about this
        call again (duplicate, CANCEL, PING)? Only its owner may; an unknown
        id or a call without a recorded owner is anyone's."""
        call = self.live.get(call_id)
        owner = call.owner if call is not None else self.cache.owner(call_id)
        return owner is None or owner == who

    def submit(self, call: CallRecord, now: float) -> list[Action]:
        """Queue a new call (check :meth:`duplicate` first: a known id is ignored)."""
        if call.id in self.live or call.id in self.cache:
            return []
        call.state = CallState.QUEUED
        self.live[call.id] = call
        self.counts["submitted"] += 1
        sch = self._queue(call.sed)
        return self._actions(sch.submit(Request(id=call.id, user=call.user, service=call.service,
                                                optional=call.optional, submitted=call.received), now), now)

    def cancel(self, call_id: str, now: float) -> tuple[str, list[Action]]:
        """The client cancels: ``(state the call was in, actions)``; the state
        is ``done`` for a finished call and ``unknown`` for an unknown id."""
        call = self.live.get(call_id)
        if call is None:
            return ("done" if call_id in self.cache else "unknown"), []
        prev = call.state.value
        actions = self._actions(self._queue(call.sed).cancel(call_id, now), now)
        if prev == CallState.QUEUED:         # never started: no Kill, answer it here
            call.state = CallState.CANCELLED
            actions.insert(0, Drop(call))
        return prev, actions

    def complete(self, call_id: str, frames: list | None, *, ok: bool, now: float) -> list[Action]:
        """The call was answered with ``frames`` (kept for duplicates when
        they fit): close its record; the queue may start the next ones."""
        call = self.live.pop(call_id, None)
        if call is None:
            return []
        sch = self._queue(call.sed)
        actions: list[Action] = []
        if call.state is CallState.RUNNING:
            call.state = CallState.FINISHED if ok else CallState.FAILED
            actions = self._actions(sch.finished(call_id, now), now)
        elif call.state is CallState.QUEUED:          # answered before it ran (e.g. shutdown)
            call.state = CallState.FAILED
            actions = self._actions(sch.cancel(call_id, now), now)
        call.ended = now
        self.counts[call.state.value] += 1
        self.cache.put(call_id, frames, call.owner, call.user)
        return actions

    def tick(self, sed: str, now: float) -> list[Action]:
        return self._actions(self._queue(sed).tick(now), now)

    def pause(self) -> None:
        """Several messages handled as one (every message of one wake-up of
        the SeD's socket): no call starts, none is preempted, until
        :meth:`resume`. O(1): a queue is paused when first touched."""
        self.paused = True

    def resume(self, now: float) -> list[tuple[str, list[Action]]]:
        """``(sed, actions)`` for every queue that has something to do now."""
        self.paused = False
        touched, self._touched = self._touched, set()
        out = []
        for sed in touched:
            actions = self._actions(self.schedulers[sed].resume(now), now)
            if actions:
                out.append((sed, actions))
        return out

    def _queue(self, sed: str) -> SedScheduler:
        sch = self.schedulers[sed]
        if self.paused and sed not in self._touched:
            self._touched.add(sed)
            sch.pause()
        return sch

    def next_wakeup(self, sed: str, now: float) -> float | None:
        return self.schedulers[sed].next_wakeup(now)

    # -- answers the back-end holds ---------------------------------------------
    def hold(self, call_id: str, frames: list | None = None) -> None:
        """The back-end keeps this finished call's answer until it is delivered
        (``frames``: the answer, also kept in memory while it fits)."""
        self.cache.hold(call_id)
        if frames is not None:
            self.cache.put(call_id, frames)

    def delivered(self, call_id: str, frames: list | None = None) -> None:
        """A held answer reached its client: it becomes an ordinary cached answer."""
        self.cache.release(call_id)
        if frames is not None:
            self.cache.put(call_id, frames)

    def release(self, call_id: str) -> None:
        """The back-end dropped a held answer (never fetched): the id stays known."""
        self.cache.release(call_id)

    def remember(self, call_id: str) -> None:
        """An id that must never run (e.g. a recovered call being cancelled)."""
        self.cache.remember(call_id)

    # -- queries ----------------------------------------------------------------
    def state(self, call_id: str) -> str:
        """For PING: queued | running | done | unknown."""
        call = self.live.get(call_id)
        if call is not None:
            return call.state.value
        return "done" if call_id in self.cache else "unknown"

    def statistics(self) -> dict:
        st = self.cache.statistics()
        return {"live": len(self.live), **self.counts, "answers": st.answers, "bytes": st.bytes,
                "max_bytes": st.max_bytes, "ids": st.ids, "held": st.held, "dropped": st.dropped}

    # -- internals --------------------------------------------------------------
    def _actions(self, sched_actions: list, now: float) -> list[Action]:
        out: list[Action] = []
        for a in sched_actions:
            call = self.live.get(a.request_id)
            if call is None:
                continue
            if isinstance(a, Start):
                call.state = CallState.RUNNING
                call.started = now
                out.append(Run(call))
            elif isinstance(a, Kill):
                call.state = CallState.CANCELLED if a.reason == "cancelled" else CallState.KILLED
                out.append(Stop(call, a.reason))
        return out
