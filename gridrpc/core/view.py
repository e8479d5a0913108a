"""Discovery from pushed state (pure): an agent's view of its subtree, the
SeD's push rule, and per-child answer latencies.

Servers push, schedulers decide locally (Sparrow, SOSP 2013; Ray's resource
view). A SeD pushes the request-independent part of its estimation vector
(one snapshot per replica: ``{service: vector}``) to its parent when it
changes materially, coalesced, and again with every heartbeat
(:class:`PushRule`). An agent keeps the latest snapshot of every SeD of its
subtree (:class:`SubtreeView`); a Local Agent pushes the changed snapshots
up in batches (at most one VIEW message every ``push_interval``), so the
Master Agent's inbound rate grows with the number of its children, not of
the SeDs. Ages travel, never clocks: a snapshot carries ``age_ms`` and each
agent dates it in its own clock on receipt.

The Master Agent answers a discovery from the view (:func:`candidates`)
when every SeD of the subtree offering the service has a snapshot fresher
than the bound (the request's ``max_age_ms`` or the agent's default); SeDs
silent for longer than the agent's bound are left out (as a fan-out would
leave them out at their deadline); a
service whose estimation depends on the request's arguments is never
pushed, so it always falls back to the fan-out. The answer is ranked by the
same aggregator as a fan-out; then near-equal candidates at the top are
split by a power-of-two random choice (:func:`power_of_two`) so that many
clients, or several agents with slightly stale views, do not herd.

:class:`ChildLatency` learns how long each child takes to answer a fan-out:
the fan-out waits for a child at most ``min(budget, max(floor, factor ×
p95))``; a child that never answered is given the pooled estimate of its
siblings, so a silent child costs milliseconds, not the whole budget.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

# the ranking of a view answer; near_equal & co. are imported from here too
from .view_rank import (VOLATILE, HERD_GROUP, ViewRanking, num, age_vector, near_equal,  # noqa: F401
                        near_equal_to, power_of_two)

DEFAULT_MAX_AGE = 1.5           # s: a snapshot is fresh for 1.5 heartbeat periods (pushed on every change)
PUSH_INTERVAL = 0.002           # s: a SeD / an LA pushes at most this often on a busy<->free change
SLOW_PUSH_INTERVAL = 0.05       # s: other load changes (queue length under load) are coalesced longer
FRESH_INTERVAL = 0.1            # s: an LA sends "still fresh" confirmations (heartbeats below) at most this
#                                 often: with 2,000 SeDs, one per heartbeat 2 ms apart woke the MA 2,000 times/s
DEADLINE_FLOOR = 0.05           # s: never wait less for a child (a noisy machine's hiccup)
DEADLINE_FACTOR = 4.0           # times the child's p95 answer latency
LATENCY_SAMPLES = 32
VIEW_INDEX_MIN = 256            # SeDs for a service from which the root keeps their ranking (view_rank.py)
MAX_RANKINGS = 8                # kept rankings (service x aggregator) at most; the least recently used goes

# -- the SeD side ---------------------------------------------------------------
class PushRule:
    """When a SeD replica pushes its snapshot: a change of whether it has a
    free slot is pushed after ``fast`` (coalesced), any other change of its
    load after ``slow``; nothing when the load is what was pushed last. The
    runtime also pushes with every heartbeat (``refresh``).

    A replica that *flaps* — back to what was pushed, then free/busy again,
    before the pending push went out (one client's sequential short calls:
    busy 0.3 ms of every 0.6) — is pushed once ``slow`` after the change
    began, with whatever its load is then: a push every 2 ms showed a random
    phase of a sub-millisecond cycle and cost every agent above a message.
    ``changed`` then returns a time *later* than the push it had announced:
    the runtime re-arms its timer (it cancels the old one on every return)."""

    __slots__ = ("fast", "slow", "pushed", "due", "since", "bounced")

    def __init__(self, fast: float = PUSH_INTERVAL, slow: float = SLOW_PUSH_INTERVAL) -> None:
        self.fast, self.slow = fast, slow
        self.pushed: tuple | None = None        # load key last pushed
        self.due: float | None = None
        self.since: float | None = None         # when the pending change began
        self.bounced = False                    # the load came back to what was pushed meanwhile

    def changed(self, key: tuple, busy: bool, now: float) -> float | None:
        """The load is now ``key`` (``busy``: no free slot). Returns when a
        push is due (None: nothing to push or already scheduled earlier)."""
        if key == self.pushed:
            if self.due is not None:
                self.bounced = True
            return None
        was_busy = self.pushed[0] if self.pushed is not None else None
        flip = busy != was_busy
        if self.due is None:
            self.since, self.bounced = now, False
        elif self.bounced and flip:                 # (since is set whenever a push is due)
            if self.due < self.since + self.slow:
                self.due = self.since + self.slow   # flapping: once, slow after it began
                return self.due
            return None                             # postponed already
        at = now + (self.fast if flip else self.slow)
        if self.due is not None and self.due <= at:
            return None
        self.due = at
        return at

    def done(self, key: tuple) -> None:
        self.pushed = key
        self.due = self.since = None
        self.bounced = False

    def take(self, key: tuple, force: bool) -> bool:
        """A push is due (its timer fired, ``force``: a heartbeat or a
        registration) and the load is now ``key``: whether to send it. Not
        ``force``d, nothing is sent when the load came back to what was
        pushed last (a call shorter than the coalescing delay)."""
        if not force and key == self.pushed:
            self.due = self.since = None
            self.bounced = False
            return False
        self.done(key)
        return True


def load_key(scheduler) -> tuple[bool, int, int]:
    """What a replica's snapshot depends on, from its
    :class:`~gridrpc.core.queue.SedScheduler`: (no free slot, running,
    waiting). :class:`PushRule` pushes when it changes."""
    running = len(scheduler.running)
    return (running >= scheduler.max_concurrent, running, len(scheduler.requests) - running)


def sed_entry(name: str, vectors: dict) -> dict | None:
    """The VIEW entry a SeD replica sends for its snapshot ``{service:
    vector}`` (the services whose estimation does not depend on the
    request); None when there is none to push."""
    if not vectors:
        return None
    common, own = split_common(vectors)
    return {"name": name, "common": common, "services": own, "age_ms": 0}


# -- an agent's view ------------------------------------------------------------
@dataclass(slots=True)
class Snapshot:
    name: str                       # the SeD (replica)
    via: str                        # the child of this agent it came through
    common: dict                    # tags shared by all its services
    services: dict                  # service -> its own tags (over ``common``)
    at: float                       # when the vector was taken, in this agent's clock
    seen: float                     # when it was last confirmed (a push or a heartbeat)

    def vector(self, service: str) -> dict | None:
        own = self.services.get(service)
        return None if own is None else {**self.common, **own}


def split_common(vectors: dict) -> tuple[dict, dict]:
    """``{service: vector}`` -> (tags equal in all, ``{service: the others}``):
    what a SeD sends (most tags are the host's and the queue's)."""
    it = iter(vectors.values())
    first = next(it, None)
    if first is None:
        return {}, {}
    common = dict(first)
    for v in it:
        for tag in [t for t, x in common.items() if v.get(t, common) != x]:
            del common[tag]
    return common, {s: {t: x for t, x in v.items() if t not in common} for s, v in vectors.items()}


class SubtreeView:
    """The latest snapshot of every SeD of the subtree, and what changed
    since the last push to the parent."""

    def __init__(self, push_interval: float = PUSH_INTERVAL, fresh_interval: float = FRESH_INTERVAL) -> None:
        self.push_interval = push_interval
        self.fresh_interval = fresh_interval    # confirmations only (nothing changed): batched longer
        self.seds: dict[str, Snapshot] = {}
        self.dirty: set[str] = set()            # to push up: a snapshot, or gone if absent
        self.fresh: set[str] = set()            # to push up: confirmed unchanged
        self.flush_at: float | None = None
        self.updates = 0                        # snapshots accepted
        self.rankings: list = []                # incremental rankings told of every changed snapshot
        self.refused = 0                        # snapshots of SeDs not in the sender's subtree

    def update(self, via: str, entries: list, gone: list, now: float, owner_of: dict) -> None:
        """Snapshots pushed by child ``via``. ``owner_of``: SeD name -> the
        child whose subtree holds it; a child speaks only for its own subtree."""
        for e in entries:
            if type(e) is not dict:
                continue
            name, services = e.get("name"), e.get("services")
            if owner_of.get(name) != via or type(services) is not dict:
                self.refused += 1
                continue
            common = e.get("common")
            at = now - _age(e.get("age_ms"))
            # last confirmed alive: an idle SeD's snapshot may be old and still true (resent whole
            # to a restarted parent, it must not arrive already expired)
            seen = max(at, now - _age(e["seen_ms"])) if "seen_ms" in e else at
            self.seds[name] = Snapshot(name, via, common if type(common) is dict else {},
                                       {s: v for s, v in services.items() if type(v) is dict}, at, seen)
            self.updates += 1
            self._changed(name, now)
        for name in gone:
            snap = self.seds.get(name)
            if snap is not None and snap.via == via:
                del self.seds[name]
                self._changed(name, now)

    def refresh(self, via: str, names, now: float, age_ms: object = 0) -> None:
        """SeDs under ``via`` are alive and unchanged (a heartbeat; a child's ``fresh`` list)."""
        seen = now - _age(age_ms)
        for name in names:
            s = self.seds.get(name)
            if s is not None and s.via == via and seen > s.seen:
                s.seen = seen
                self.fresh.add(name)
                if self.flush_at is None:
                    self.flush_at = now + self.fresh_interval

    def resend_all(self, now: float) -> None:
        """Push every snapshot again with the next batch (the parent restarted
        or registered us anew: it knows none of them)."""
        for name in self.seds:
            self._dirty(name, now)

    def resend(self, names, now: float) -> int:
        """Push these snapshots again with the next batch (the parent says it
        lacks them: ``view_missing``); returns how many this view has."""
        n = 0
        for name in names:
            if name in self.seds:
                self._dirty(name, now)
                n += 1
        return n

    def drop_via(self, via: str, now: float) -> None:
        for name in [n for n, s in self.seds.items() if s.via == via]:
            del self.seds[name]
            self._changed(name, now)

    def expire(self, now: float, timeout: float) -> None:
        """Forget snapshots older than ``timeout`` (a SeD that died under a
        child leaves the view within the heartbeat timeout)."""
        for name in [n for n, s in self.seds.items() if now - s.seen > timeout]:
            del self.seds[name]
            self._changed(name, now)

    def _changed(self, name: str, now: float) -> None:
        """A snapshot replaced or removed: pushed up, and re-ranked."""
        for r in self.rankings:
            r.changed(name)
        self._dirty(name, now)

    def _dirty(self, name: str, now: float) -> None:
        self.dirty.add(name)
        at = now + self.push_interval
        if self.flush_at is None or at < self.flush_at:   # a change: pushed soon, confirmations with it
            self.flush_at = at

    def take(self, now: float) -> dict:
        """The batch to push to the parent (the VIEW fields): changed
        snapshots with their age, SeDs confirmed unchanged (``fresh``), SeDs gone."""
        entries, gone = [], []
        for name in self.dirty:
            s = self.seds.get(name)
            if s is None:
                gone.append(name)
            else:
                entries.append({"name": name, "common": s.common, "services": s.services,
                                "age_ms": max(0.0, (now - s.at) * 1000.0),
                                "seen_ms": max(0.0, (now - s.seen) * 1000.0)})
        fresh = [n for n in self.fresh if n not in self.dirty and n in self.seds]
        self.dirty.clear()
        self.fresh.clear()
        self.flush_at = None
        out: dict = {"entries": entries}
        if gone:
            out["gone"] = gone
        if fresh:
            out["fresh"] = fresh
        return out


def candidates(view: SubtreeView, expected: dict, service: str, now: float, max_age: float,
               skip: frozenset | set = frozenset(), silent_after: float | None = None) -> list[dict] | None:
    """Servers for ``service`` from the view, as a fan-out would collect
    them (``{name, address, estimation}``, ages applied to the time tags),
    or None when a SeD of the subtree offering it has no snapshot fresher
    than ``max_age`` (or none is left). A SeD that pushed, then fell silent
    for longer than ``silent_after`` (no push, no heartbeat: frozen, dead, cut
    off; the agent's own freshness bound) is left out, as the fan-out would
    leave it out at its deadline -- so a silent SeD costs a view answer
    nothing, instead of turning every discovery into a fan-out that waits
    for it until its parent drops it.
    ``expected``: SeD name -> (address, via child) of those offering it (from
    the registry, never from a push); ``skip``: children known silent, left
    out as a fan-out would leave them out at their deadline."""
    out = []
    seds = view.seds
    for name, (address, via) in expected.items():
        s = seds.get(name)
        est = s.vector(service) if s is not None and s.via == via else None
        if est is None:                         # never pushed (or not pushable): the fan-out asks it
            if via in skip:
                continue
            return None
        silent = now - s.seen
        if silent_after is not None and silent > silent_after:
            continue                            # silent: left out, as the fan-out would at its deadline
        if silent > max_age:                    # not fresh enough for this request: the fan-out asks
            if via in skip:
                continue
            return None
        age_vector(est, now - s.at)             # est is a fresh dict (Snapshot.vector): aged in place
        out.append({"name": name, "address": address, "estimation": est, "_at": s.at})
    return out or None


def _age(age_ms: object) -> float:
    return age_ms / 1000.0 if type(age_ms) in (int, float) and 0 <= age_ms < 1e9 else 0.0


# -- fan-out deadlines --------------------------------------------------------------
#: index of the 95th percentile in n sorted samples
_P95 = [0] + [min(n - 1, int(math.ceil(0.95 * n)) - 1) for n in range(1, LATENCY_SAMPLES + 2)]


class _Window:
    """The last samples of the children that share them (see :meth:`ChildLatency.observe_all`)."""
    __slots__ = ("xs", "srt", "members", "p95")

    def __init__(self, xs: list, srt: list) -> None:
        self.xs, self.srt = xs, srt     # in arrival order; the same, sorted
        self.members: list = []         # the children sharing it, in the order they joined
        self.p95 = 0.0

    def add(self, seconds: float) -> None:
        xs, srt = self.xs, self.srt
        xs.append(seconds)
        bisect.insort(srt, seconds)
        if len(xs) > LATENCY_SAMPLES:
            del srt[bisect.bisect_left(srt, xs.pop(0))]
        self.p95 = srt[_P95[len(srt)]]


class ChildLatency:
    """Per-child answer latencies of fan-outs (the last ``LATENCY_SAMPLES``)."""

    def __init__(self, floor: float = DEADLINE_FLOOR, factor: float = DEADLINE_FACTOR) -> None:
        self.floor, self.factor = floor, factor
        self.samples: dict[str, list[float]] = {}
        self._sorted: dict[str, list[float]] = {}   # the same samples, kept sorted
        self._window: dict[str, _Window] = {}       # child -> its window (the lists of both dicts above)
        self.p95: dict[str, float] = {}
        self.missed: dict[str, float] = {}          # child -> when it last missed its deadline

    def observe(self, child: str, seconds: float) -> None:
        self.observe_all([child], seconds)

    def observe_all(self, children, seconds: float) -> None:
        """``children`` answered in ``seconds`` (the replicas of one SeD
        process answer together). Called once per child and fan-out: the
        samples are kept sorted, never sorted again. Children observed
        together from their first sample on have the same samples: they
        share one window, updated once (a leaf agent observes its SeD
        process's replicas at every fan-out); one observed without the
        others gets a copy of its own first. The same samples and p95 as a
        window per child (tests/test_core_fast_paths.py)."""
        if not isinstance(children, list):
            children = list(children)
        windows = self._window
        w = windows.get(children[0]) if children else None
        if w is not None and w.members == children:     # the children of one window, as last time
            w.add(seconds)
            p95, missed, x = self.p95, self.missed, w.p95
            for child in children:
                p95[child] = x
                if missed:
                    missed.pop(child, None)
            return
        if len(children) > 1 and len(set(children)) < len(children):
            for child in children:          # a child named twice is observed twice, in turn
                self.observe_all([child], seconds)
            return
        groups: dict[int, tuple[_Window, list]] = {}
        fresh: list = []
        for child in children:
            w = windows.get(child)
            if w is None:
                fresh.append(child)
                continue
            g = groups.get(id(w))
            if g is None:
                groups[id(w)] = (w, [child])
            else:
                g[1].append(child)
        if fresh:
            w = _Window([], [])
            self._join(fresh, w)
            groups[id(w)] = (w, fresh)
        for w, observed in groups.values():
            if len(observed) < len(w.members):     # some who share it were not observed: these go on with a copy
                gone = set(observed)
                w.members = [c for c in w.members if c not in gone]
                w = _Window(list(w.xs), list(w.srt))
                self._join(observed, w)
            w.add(seconds)
        p95, missed = self.p95, self.missed
        for child in children:              # in the children's order (as one window per child would)
            p95[child] = windows[child].p95
            if missed:
                missed.pop(child, None)

    def _join(self, children: list, w: _Window) -> None:
        """``children`` (in order) take window ``w``."""
        w.members.extend(children)
        windows, samples, ordered = self._window, self.samples, self._sorted
        for child in children:
            windows[child] = w
            samples[child] = w.xs
            ordered[child] = w.srt

    def miss(self, child: str, now: float) -> None:
        self.missed[child] = now

    def forget(self, child: str) -> None:
        w = self._window.pop(child, None)
        if w is not None:
            w.members.remove(child)
        self.samples.pop(child, None)
        self._sorted.pop(child, None)
        self.p95.pop(child, None)
        self.missed.pop(child, None)

    def silent(self, since: float) -> set[str]:
        """Children that missed a deadline after ``since`` without answering since."""
        return {c for c, t in self.missed.items() if t >= since}

    def deadline(self, children, budget: float) -> float:
        """Seconds to wait for ``children``: the largest of their bounds,
        each ``min(budget, max(floor, factor × p95))``; a child never
        measured gets the largest p95 of its measured siblings (none: the budget)."""
        p95 = self.p95
        if not p95:
            return budget
        prior = None
        worst = 0.0
        for c in children:
            x = p95.get(c)
            if x is None:
                if prior is None:
                    prior = max(p95.values())
                x = prior
            if x > worst:
                worst = x
        return min(budget, max(self.floor, self.factor * worst))
