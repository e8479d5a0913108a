"""SeD request queue: a pure scheduler plus pluggable ordering policies.

The :class:`SedScheduler` keeps the waiting and running requests of one SeD
(only those: the ids a SeD has seen, and their answers, are
:class:`~gridrpc.core.sed_calls.SedCalls`'s, which wraps the schedulers).
After every change it asks its policy for the full ordering of all requests
(running and waiting); the first ``max_concurrent`` of that ordering should be
running. The difference with what *is* running gives the actions:
:class:`Start` for requests entering the front and :class:`Kill` for running
requests pushed out of it (preemption). FCFS never preempts because it puts
running requests first.

Policies are small classes behind :class:`QueuePolicy`, registered by name in
:data:`POLICIES` (``fcfs`` — first come, first served per user, users in
turn — and ``fifo`` — one arrival order for everyone — here, ``ethic`` in
:mod:`gridrpc.core.queue_ethic`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar, Mapping, Protocol, Sequence


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One call as the queue sees it."""
    id: str
    user: str
    service: str
    optional: bool = False
    submitted: float = 0.0          # time the SeD received it
    seq: int = 0                    # arrival order on this SeD (tie-break for equal times)


@dataclass(frozen=True, slots=True)
class Start:
    request_id: str


@dataclass(frozen=True, slots=True)
class Kill:
    request_id: str
    reason: str = "preempted"


Action = Start | Kill


class QueuePolicy(Protocol):
    """Orders requests; the first ``max_concurrent`` of the order run.

    ``running`` maps request id -> start time for requests currently running.
    ``allocated`` maps user -> server-seconds already given to that user on this
    SeD (finished and killed work, plus the elapsed time of running requests).
    ``rng`` is seeded by the runtime; use it for random tie-breaks.

    Optional: ``front(requests, running, now, k)`` returning the first ``k``
    of the order when it knows them without ordering (else None), as ethic's
    does when mandatory requests fill the slots.
    """
    name: ClassVar[str]

    def order(self, requests: Sequence[Request], running: Mapping[str, float],
              allocated: Mapping[str, float], now: float,
              rng: random.Random) -> list[Request]: ...


class FCFSPolicy:
    """First come, first served per user, round-robin between users. Running
    requests are never preempted. When a slot frees, the scheduler starts
    the earliest request of the user with the fewest running, on ties the
    user whose turn came longest ago. With one user it is plain FCFS; with
    several, a user who queued 10,000 calls does not make the next user wait
    behind them: each user's next request takes the next free slot in turn.
    Optional requests are treated like any other.

    :meth:`order` (used only when arrivals came out of submit order, e.g. a
    clock step) is the same rule without the turn history: waiting requests
    by round (a user's k-th waiting request is in round k plus that user's
    running requests), then by arrival."""
    name: ClassVar[str] = "fcfs"
    # running requests are never pushed off the front and each user's requests start in their
    # arrival order: the scheduler picks the next one itself, without the full sort (O(users) per
    # event, O(1) with one user waiting)
    arrival_order: ClassVar[bool] = True

    def order(self, requests, running, allocated, now, rng):
        run = sorted((r for r in requests if r.id in running), key=lambda r: (running[r.id], r.submitted, r.seq))
        wait = sorted((r for r in requests if r.id not in running), key=lambda r: (r.submitted, r.seq))
        rounds: dict[str, int] = {}
        for r in run:
            rounds[r.user] = rounds.get(r.user, 0) + 1
        keyed = []
        for i, r in enumerate(wait):
            k = rounds.get(r.user, 0)
            rounds[r.user] = k + 1
            keyed.append((k, i))
        keyed.sort()
        return run + [wait[i] for _, i in keyed]


class FIFOPolicy:
    """One queue in arrival order, whoever sent the requests (DIET's FCFS):
    running requests first (never preempted), then waiting requests by
    arrival. A user who floods the queue makes every later user wait behind
    the flood; kept as the baseline of the optional-computation experiments
    (their "legacy" SeDs), not for shared trees."""
    name: ClassVar[str] = "fifo"
    arrival_order: ClassVar[bool] = True
    between_users: ClassVar[str] = "arrival"     # no turns between users: the earliest request first

    def order(self, requests, running, allocated, now, rng):
        return sorted(requests, key=lambda r: (r.id not in running,
                                               running.get(r.id, 0.0), r.submitted, r.seq))


POLICIES: dict[str, type] = {"fcfs": FCFSPolicy, "fifo": FIFOPolicy}


def register_policy(cls: type) -> type:
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str, **options) -> QueuePolicy:
    """A policy by name with its options (e.g. ``make_policy("ethic", kill_grace=2.0)``)."""
    # import for registration side effects of the built-in policies
    from . import queue_ethic  # noqa: F401
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown queue policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"bad options for queue policy {name!r}: {exc}") from None


@dataclass(slots=True)
class SedScheduler:
    """The queue of one SeD. Pure: call with ``now``, apply the returned actions."""
    policy: QueuePolicy
    max_concurrent: int = 1
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    requests: dict[str, Request] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)      # id -> start time
    allocated: dict[str, float] = field(default_factory=dict)    # user -> server-seconds (closed work)
    _seq: int = 0
    _in_submit_order: bool = True        # arrivals came with non-decreasing submit times
    _last_submitted: float = float("-inf")
    _idle_since: float = float("-inf")   # when the last running request ended (a gather counts from it)
    _paused: bool = False                # between pause() and resume(): nothing starts
    _dirty: bool = False                 # something changed while paused
    _promised: str | None = None         # starts next, whatever arrives meanwhile (promise_next)
    _waiting: dict = field(default_factory=dict)     # user -> {waiting request id: None}, in arrival order
    _busy: dict = field(default_factory=dict)        # user -> requests running
    _turn: dict = field(default_factory=dict)        # user -> when it last started a request (start count)
    _starts: int = 0

    def pause(self) -> None:
        """Take several inputs as one (a batch of messages): until
        :meth:`resume`, arrivals, ends and cancellations are recorded but
        nothing starts (and no preemption), so a burst of cancellations does
        not start, then kill, each next request in turn."""
        self._paused = True

    def resume(self, now: float) -> list[Action]:
        """End of the pause: what the queue decides now, once."""
        self._paused = False
        if not self._dirty:
            return []
        self._dirty = False
        return self._reschedule(now)

    def has_free_slot(self) -> bool:
        """Would a request submitted now start at once (a free slot, nobody
        waiting)? The SeD's answer to a CALL with ``start_now`` (late binding)."""
        return len(self.requests) < self.max_concurrent

    # -- inputs ---------------------------------------------------------
    def submit(self, req: Request, now: float) -> list[Action]:
        """Add a request. The id of a request already here (waiting or
        running) is ignored; ids of requests that ended are for the caller to
        refuse (:class:`~gridrpc.core.sed_calls.SedCalls` does)."""
        if req.id in self.requests:
            return []
        self._seq += 1
        if req.seq == 0:
            req = Request(id=req.id, user=req.user, service=req.service, optional=req.optional,
                          submitted=req.submitted, seq=self._seq)
        self.requests[req.id] = req
        w = self._waiting.get(req.user)
        if w is None:
            self._waiting[req.user] = {req.id: None}
        else:
            w[req.id] = None
        if req.submitted < self._last_submitted:
            self._in_submit_order = False     # e.g. a clock step: fall back to the full sort
        self._last_submitted = max(self._last_submitted, req.submitted)
        if self._paused and not self._dirty and len(self.requests) <= self.max_concurrent \
                and self._in_submit_order and getattr(self.policy, "arrival_order", False):
            # an arrival-ordered queue with a slot for every request: what resume would start is this
            # request, and nothing later in the batch can come before it; it starts now (a call to an
            # idle SeD reaches its worker before the end of the socket's read: 81 -> 65 µs from the
            # message to the worker's pipe, docs/performance.md). Not when something else changed the
            # queue in this pause: a slot a cancel freed waits for resume (the SeD's CANCEL_GRACE)
            self._paused = False
            try:
                return self._reschedule(now)
            finally:
                self._paused = True
        return self._reschedule(now)

    def finished(self, request_id: str, now: float) -> list[Action]:
        """A running request ended (success or failure)."""
        self._close(request_id, now)
        return self._reschedule(now)

    def cancel(self, request_id: str, now: float) -> list[Action]:
        """Client cancelled: a waiting request is removed; a running one is killed."""
        if request_id not in self.requests:
            return []
        actions: list[Action] = []
        if request_id in self.running:
            actions.append(Kill(request_id, "cancelled"))
        self._close(request_id, now)
        return actions + self._reschedule(now)

    def tick(self, now: float) -> list[Action]:
        """Re-evaluate without an event (policies with time-dependent rules,
        e.g. ethic's kill_grace); call at :meth:`next_wakeup`."""
        return self._reschedule(now)

    def next_wakeup(self, now: float) -> float | None:
        fn = getattr(self.policy, "next_wakeup", None)
        if fn is None:
            return None
        return fn(list(self.requests.values()), self.running, now)

    # -- queries --------------------------------------------------------
    def next_waiting(self) -> str | None:
        """The request that will start when a running one ends: an
        arrival-ordered queue (FCFS) with every slot busy, arrivals in submit
        order. None otherwise (other policies decide at the end; a later
        arrival may come first). Certain with one user waiting; with several,
        it is the fair choice as things stand, and :meth:`promise_next` makes
        it so. A pause changes nothing to it: a slot freed during one (a
        cancel) leaves fewer running."""
        if (not self._in_submit_order or len(self.running) < self.max_concurrent
                or not getattr(self.policy, "arrival_order", False) or not self._waiting):
            return None
        return self._next_fair()

    def promise_next(self, request_id: str) -> None:
        """``request_id`` (what :meth:`next_waiting` named) starts when the
        next slot frees, even if a request admitted later with an older
        submit time (a call whose data was fetched first, a clock step)
        would now come first: the SeD has handed it to a worker already."""
        self._promised = request_id

    def waiting(self) -> list[Request]:
        return [r for rid, r in self.requests.items() if rid not in self.running]

    def user_allocation(self, now: float) -> dict[str, float]:
        alloc = dict(self.allocated)
        for rid, start in self.running.items():
            u = self.requests[rid].user
            alloc[u] = alloc.get(u, 0.0) + max(0.0, now - start)
        return alloc

    def statistics(self) -> dict:
        return {"policy": self.policy.name, "max_concurrent": self.max_concurrent,
                "num_running": len(self.running),
                "num_waiting": len(self.requests) - len(self.running),
                "allocated": dict(self.allocated)}

    # -- internals ------------------------------------------------------
    def _next_fair(self) -> str:
        """The waiting request an arrival-ordered queue starts next: the first
        of the user with the fewest running; on ties, the user whose turn
        came longest ago (round-robin), then the earliest arrival."""
        w = self._waiting
        if len(w) == 1:
            return next(iter(next(iter(w.values()))))
        busy, turn, reqs = self._busy, self._turn, self.requests
        fair = getattr(self.policy, "between_users", "turns") == "turns"
        best, best_key = "", None
        for user, ids in w.items():
            rid = next(iter(ids))
            r = reqs[rid]
            key = (busy.get(user, 0), turn.get(user, -1), r.submitted, r.seq) if fair else (r.submitted, r.seq)
            if best_key is None or key < best_key:
                best, best_key = rid, key
        return best

    def _run(self, request_id: str, now: float) -> None:
        self.running[request_id] = now
        user = self.requests[request_id].user
        w = self._waiting.get(user)
        if w is not None:
            w.pop(request_id, None)
            if not w:
                del self._waiting[user]
        self._busy[user] = self._busy.get(user, 0) + 1
        self._starts += 1
        self._turn[user] = self._starts

    def _close(self, request_id: str, now: float) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            if request_id in self.running:
                n = self._busy.get(req.user, 0) - 1
                if n > 0:
                    self._busy[req.user] = n
                else:
                    self._busy.pop(req.user, None)
            else:
                w = self._waiting.get(req.user)
                if w is not None:
                    w.pop(request_id, None)
                    if not w:
                        del self._waiting[req.user]
            if req.user not in self._busy and req.user not in self._waiting:
                self._turn.pop(req.user, None)      # nothing left here: its turn is forgotten
        start = self.running.pop(request_id, None)
        if req is not None and start is not None:
            self.allocated[req.user] = self.allocated.get(req.user, 0.0) + max(0.0, now - start)
            if not self.running:
                self._idle_since = now
        if not self.requests:
            self._in_submit_order, self._last_submitted = True, float("-inf")

    def _reschedule(self, now: float) -> list[Action]:
        if self._paused:
            self._dirty = True
            return []
        if not self.requests:
            return []
        promised = self._promised
        if promised is not None:
            if promised not in self.requests or promised in self.running:
                self._promised = None
            elif len(self.running) < self.max_concurrent:
                self._promised = None
                self._run(promised, now)
                return [Start(promised), *self._reschedule(now)]
        if getattr(self.policy, "arrival_order", False) and self._in_submit_order:
            free = self.max_concurrent - len(self.running)
            started: list[Action] = []
            while free > 0 and self._waiting:
                rid = self._next_fair()
                self._run(rid, now)
                started.append(Start(rid))
                free -= 1
            return started
        if not self.running:
            hold = getattr(self.policy, "hold_until", None)     # e.g. ethic's gather: a burst is ranked whole
            if hold is not None:
                reqs = list(self.requests.values())
                # only a burst that came while the SeD was idle: requests that waited through a busy
                # period are all here already
                if (hold(reqs, self.running, now) is not None
                        and min(r.submitted for r in reqs) >= self._idle_since):
                    return []
        settled = getattr(self.policy, "settled", None)
        if settled is not None and len(self.running) >= self.max_concurrent and settled(self.requests, self.running):
            return []           # every slot busy and nothing waiting may take one: the order cannot change
        first = getattr(self.policy, "front", None)     # the order's first slots, when known without it
        top = first(self.requests.values(), self.running, now, self.max_concurrent) if first else None
        if top is None:
            top = self.policy.order(list(self.requests.values()), self.running,
                                    self.user_allocation(now), now, self.rng)[: self.max_concurrent]
        front = {r.id for r in top}
        actions: list[Action] = []
        for rid in [rid for rid in self.running if rid not in front]:
            actions.append(Kill(rid, "preempted"))
            self._close(rid, now)
        for r in top:
            if r.id not in self.running:
                self._run(r.id, now)
                actions.append(Start(r.id))
        return actions
