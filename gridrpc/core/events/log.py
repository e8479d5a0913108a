"""The MA's event log (:mod:`gridrpc.core.events`): a count-bounded ring,
one call's story by request id, and rolling aggregates per service and per
user, from which the dashboard, ``gridrpc top`` and ``/metrics`` read.

Events are bucketed by the ``now`` the log's owner passes to
:meth:`EventLog.append` (the MA's clock), never by the emitter's ``time``.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import OrderedDict, deque
from itertools import islice
from typing import Any, Iterable, Iterator

from .event import CALL_KINDS, ERROR_KINDS, LATENCY_BOUNDS, OUTCOME, TERMINAL, Event, EventKind

__all__ = ["EventLog", "OTHER", "quantile", "story_summary"]


class _Svc:
    """One service's numbers in one time bucket (or cumulated)."""
    __slots__ = ("ok", "err", "other", "timed", "run_sum", "run_max", "hist", "wait_n", "wait_sum", "disc_n", "disc_sum")

    def __init__(self) -> None:
        self.ok = self.err = self.other = self.timed = self.wait_n = self.disc_n = 0
        self.run_sum = self.run_max = self.wait_sum = self.disc_sum = 0.0
        self.hist = [0] * (len(LATENCY_BOUNDS) + 1)


class _Bucket:
    __slots__ = ("index", "services", "users", "events")

    def __init__(self, index: int) -> None:
        self.index = index
        self.services: dict[str, _Svc] = {}
        self.users: dict[str, list] = {}      # user -> [calls, allocated seconds]
        self.events = 0


OTHER = "(other)"     # label for services/users beyond the cardinality caps

_KIND_NAME = {k: k.value for k in EventKind}
_QUEUED, _STARTED, _FINISHED = EventKind.CALL_QUEUED, EventKind.CALL_STARTED, EventKind.CALL_FINISHED
_DISCOVERIES = frozenset({EventKind.DISCOVERY_ANSWERED, EventKind.DISCOVERY_FAILED})
_AGGREGATED = CALL_KINDS | _DISCOVERIES                 # the kinds _aggregate counts
_ERROR_OUTCOMES = frozenset({EventKind.CALL_FAILED, EventKind.CALL_KILLED})


class EventLog:
    """The MA's memory of events, bounded in every direction.

    * a ring of the last ``capacity`` events, numbered by a sequence ``seq``
      (1, 2, ...) for resumable streams (:meth:`since`);
    * one call's story: the events of the last ``max_stories`` request ids,
      at most ``story_len`` each (the first ones and always the latest);
    * rolling aggregates in ``bucket``-second buckets over ``window`` seconds
      (by the ``now`` given to :meth:`append`): per service calls, errors,
      run time (mean, max, histogram), queue wait, discoveries; per user
      calls and server-seconds; plus cumulative counters and histograms for
      Prometheus, and the latest ``max_errors`` errors.

    Services and users beyond ``max_services``/``max_users`` distinct names
    are counted under ``"(other)"`` so hostile names cannot exhaust memory.
    """

    def __init__(self, *, capacity: int = 10000, max_stories: int = 5000, story_len: int = 32,
                 bucket: float = 5.0, window: float = 600.0, rate_buckets: int = 2,
                 max_services: int = 256, max_users: int = 1024, max_errors: int = 50) -> None:
        if bucket <= 0 or window < bucket or story_len < 2 or capacity < 1:
            raise ValueError("need bucket > 0, window >= bucket, story_len >= 2, capacity >= 1")
        self.capacity = capacity
        self.bucket = float(bucket)
        self.nbuckets = int(math.ceil(window / bucket))
        self.window = self.nbuckets * self.bucket
        self.rate_buckets = max(1, min(rate_buckets, self.nbuckets))
        self.max_stories, self.story_len = max_stories, story_len
        self.max_services, self.max_users = max_services, max_users
        self.seq = 0
        self._ring: deque[tuple[int, Event]] = deque(maxlen=capacity)
        self._stories: OrderedDict[str, list[tuple[int, Event]]] = OrderedDict()
        self._buckets: deque[_Bucket] = deque()
        self.errors: deque[tuple[int, Event]] = deque(maxlen=max_errors)
        self.events_total: dict[str, int] = {}
        self.calls_total: dict[tuple[str, str], int] = {}       # (service, outcome) -> n
        self.user_total: dict[tuple[str, str], int] = {}        # (user, outcome|"queued") -> n
        self.optional_total: dict[tuple[str, str], int] = {}    # (user, outcome) -> n, optional calls
        self.cumulative: dict[str, _Svc] = {}                   # service -> since start
        self._services: set[str] = set()
        self._users: set[str] = set()

    # -- writing -----------------------------------------------------------
    # append and _aggregate run for every event of the tree (on the MA): the
    # kinds they test are module constants (an EventKind.X lookup costs ~80 ns,
    # k.value ~120 ns), and the usual cases (the current bucket, a known
    # service or user) are tested inline before calling the general code.
    def append(self, ev: Event, now: float) -> int:
        """Record one event; returns its sequence number. O(1)."""
        self.seq = seq = self.seq + 1
        item = (seq, ev)
        self._ring.append(item)
        k = ev.kind
        name = _KIND_NAME[k]
        totals = self.events_total
        totals[name] = totals.get(name, 0) + 1
        rid = ev.id
        if rid is not None:
            stories = self._stories
            st = stories.get(rid)
            if st is None:
                if len(stories) >= self.max_stories:
                    stories.popitem(last=False)
                stories[rid] = [item]
            elif len(st) < self.story_len:
                st.append(item)
            else:
                st[-1] = item
        if k in ERROR_KINDS:
            self.errors.append(item)
        bs = self._buckets
        if bs and int(now // self.bucket) <= bs[-1].index:    # late or same bucket: the newest one
            b = bs[-1]
        else:
            b = self._bucket_at(now)
        b.events += 1
        if k in _AGGREGATED:
            self._aggregate(b, ev, k)
        return seq

    def _aggregate(self, b: _Bucket, ev: Event, k: EventKind) -> None:
        svc_name = ev.service or "?"
        if svc_name not in self._services:
            svc_name = self._cap(svc_name, self._services, self.max_services)
        s = b.services.get(svc_name)
        if s is None:
            s = b.services[svc_name] = _Svc()
        c = self.cumulative.get(svc_name)
        if c is None:
            c = self.cumulative[svc_name] = _Svc()
        d = ev.duration
        if k in _DISCOVERIES:
            for x in (s, c):
                x.disc_n += 1
                x.disc_sum += d or 0.0
            return                            # a discovery is not a call: users untouched
        user = ev.user or "anonymous"
        if user not in self._users:
            user = self._cap(user, self._users, self.max_users)
        u = b.users.get(user)                 # any call event makes its user active in the window
        if u is None:
            u = b.users[user] = [0, 0.0]
        if k is _QUEUED:
            key = (user, "queued")
            self.user_total[key] = self.user_total.get(key, 0) + 1
        elif k is _STARTED:
            if d is not None:
                for x in (s, c):
                    x.wait_n += 1
                    x.wait_sum += d
        else:                                 # terminal
            outcome = OUTCOME[k]
            key = (svc_name, outcome)
            self.calls_total[key] = self.calls_total.get(key, 0) + 1
            key = (user, outcome)
            self.user_total[key] = self.user_total.get(key, 0) + 1
            if ev.optional:
                self.optional_total[key] = self.optional_total.get(key, 0) + 1
            u[0] += 1
            if d is not None:
                u[1] += d
            if k is _FINISHED:
                s.ok += 1
                c.ok += 1
                if d is not None:             # run time known: mean, max, histogram
                    i = bisect_left(LATENCY_BOUNDS, d)
                    for x in (s, c):
                        x.timed += 1
                        x.run_sum += d
                        if d > x.run_max:
                            x.run_max = d
                        x.hist[i] += 1
            elif k in _ERROR_OUTCOMES:
                s.err += 1
                c.err += 1
            else:                             # cancelled, preempted: ended, not an error
                s.other += 1
                c.other += 1

    @staticmethod
    def _cap(name: str, known: set[str], limit: int) -> str:
        if name in known:
            return name
        if len(known) >= limit:
            return OTHER
        known.add(name)
        return name

    def _bucket_at(self, now: float) -> _Bucket:
        idx = int(now // self.bucket)
        bs = self._buckets
        if bs and idx <= bs[-1].index:        # late or same bucket: the newest one
            return bs[-1]
        if bs and idx - bs[-1].index > self.nbuckets:
            bs.clear()
        b = _Bucket(idx)
        bs.append(b)
        while bs and bs[0].index <= idx - self.nbuckets:
            bs.popleft()
        return b

    # -- reading -----------------------------------------------------------
    @property
    def first_seq(self) -> int:
        """Sequence number of the oldest event still in the ring (seq+1 if empty)."""
        return self._ring[0][0] if self._ring else self.seq + 1

    def since(self, seq: int, limit: int | None = None) -> list[tuple[int, Event]]:
        """Events after ``seq`` still in the ring, oldest first."""
        start = max(0, seq + 1 - self.first_seq)
        it = islice(self._ring, start, None if limit is None else start + limit)
        return list(it)

    def latest(self, n: int) -> list[tuple[int, Event]]:
        n = max(0, min(n, len(self._ring)))
        return list(islice(self._ring, len(self._ring) - n, None))

    def story(self, request_id: str) -> list[tuple[int, Event]]:
        return list(self._stories.get(request_id, ()))

    def __len__(self) -> int:
        return len(self._ring)

    def __iter__(self) -> Iterator[tuple[int, Event]]:
        return iter(list(self._ring))

    def _window(self, now: float) -> tuple[int, list[_Bucket]]:
        cur = max(int(now // self.bucket), self._buckets[-1].index if self._buckets else 0)
        return cur, [b for b in self._buckets if b.index > cur - self.nbuckets]

    def _span(self, now: float, cur: int) -> float:
        """Seconds covered by the last ``rate_buckets`` buckets at ``now`` (the
        current one for its elapsed part), never less than one bucket."""
        elapsed = min(self.bucket, max(0.0, now - cur * self.bucket))
        return max(self.bucket, (self.rate_buckets - 1) * self.bucket + elapsed)

    def rates(self, now: float) -> dict[str, float]:
        """Ended calls (any outcome) per second per service over the last
        ``rate_buckets`` buckets: their count divided by :meth:`_span`."""
        cur, bs = self._window(now)
        span = self._span(now, cur)
        out: dict[str, float] = {}
        for b in bs:
            if b.index > cur - self.rate_buckets:
                for name, s in b.services.items():
                    out[name] = out.get(name, 0.0) + s.ok + s.err + s.other
        return {k: v / span for k, v in out.items()}

    def stats(self, now: float) -> dict[str, Any]:
        """The aggregates as JSON-able data (``/api/stats``)."""
        cur, bs = self._window(now)
        first = cur - self.nbuckets + 1
        n = self.nbuckets
        t_axis = [(first + i) * self.bucket for i in range(n)]
        rates = self.rates(now)
        services: dict[str, Any] = {}
        names = set(self.cumulative)
        for b in bs:
            names.update(b.services)
        for name in sorted(names):
            calls, errors, mean = [0] * n, [0] * n, [None] * n
            agg = _Svc()
            for b in bs:
                s = b.services.get(name)
                if s is None:
                    continue
                i = b.index - first
                calls[i], errors[i] = s.ok + s.err + s.other, s.err
                mean[i] = s.run_sum / s.timed if s.timed else None
                _merge(agg, s)
            services[name] = {
                "calls_per_s": rates.get(name, 0.0), "calls": agg.ok + agg.err + agg.other,
                "errors": agg.err,
                "mean": agg.run_sum / agg.timed if agg.timed else None,
                "max": agg.run_max if agg.timed else None,
                "p50": _clamp(quantile(agg.hist, 0.5), agg), "p95": _clamp(quantile(agg.hist, 0.95), agg),
                "wait_mean": agg.wait_sum / agg.wait_n if agg.wait_n else None,
                "discoveries": agg.disc_n,
                "discovery_mean": agg.disc_sum / agg.disc_n if agg.disc_n else None,
                "total": {o: self.calls_total.get((name, o), 0) for o in OUTCOME.values()},
                "series": {"calls": calls, "errors": errors, "mean": mean}}
        users = self._user_stats(bs)
        sats = [u["satisfaction"] for u in users.values() if u["satisfaction"] is not None]
        return {"now": now, "seq": self.seq, "bucket": self.bucket, "window": self.window,
                "rate_span": self.rate_buckets * self.bucket, "t": t_axis,
                "calls_per_s": sum(rates.values()), "events_total": dict(self.events_total),
                "events_per_s": sum(b.events for b in bs if b.index > cur - self.rate_buckets)
                / self._span(now, cur),
                "services": services, "users": users,
                "unfairness": (max(sats) - min(sats)) if len(sats) >= 2 else 0.0,
                "errors": [dict(e.to_dict(), seq=q) for q, e in reversed(self.errors)]}

    def _user_stats(self, bs: list[_Bucket]) -> dict[str, Any]:
        active: dict[str, list] = {}
        for b in bs:
            for u, (calls, alloc) in b.users.items():
                a = active.setdefault(u, [0, 0.0])
                a[0] += calls
                a[1] += alloc
        total = sum(a[1] for a in active.values())
        fair = total / len(active) if active and total > 0 else None
        names = set(active) | {u for u, _ in self.user_total}
        out = {}
        for u in sorted(names):
            a = active.get(u)
            out[u] = {"queued": self.user_total.get((u, "queued"), 0),
                      **{o: self.user_total.get((u, o), 0) for o in OUTCOME.values()},
                      "optional_completed": self.optional_total.get((u, "finished"), 0),
                      "optional_killed": self.optional_total.get((u, "killed"), 0)
                      + self.optional_total.get((u, "preempted"), 0),
                      "window_calls": a[0] if a else 0, "allocated": a[1] if a else 0.0,
                      "satisfaction": (a[1] / fair) if (a is not None and fair) else None}
        return out


def _merge(into: _Svc, s: _Svc) -> None:
    into.ok += s.ok
    into.err += s.err
    into.other += s.other
    into.timed += s.timed
    into.run_sum += s.run_sum
    into.run_max = max(into.run_max, s.run_max)
    into.wait_n += s.wait_n
    into.wait_sum += s.wait_sum
    into.disc_n += s.disc_n
    into.disc_sum += s.disc_sum
    for i, v in enumerate(s.hist):
        into.hist[i] += v


def _clamp(q: float | None, s: _Svc) -> float | None:
    return None if q is None else min(q, s.run_max)


def quantile(hist: list[int], q: float) -> float | None:
    """The ``q`` quantile of a :data:`LATENCY_BOUNDS` histogram: linear
    interpolation inside the bucket that holds it (the +Inf bucket answers
    its lower bound)."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    acc = 0
    for i, c in enumerate(hist):
        if c and acc + c >= rank:
            lo = LATENCY_BOUNDS[i - 1] if i > 0 else 0.0
            if i == len(LATENCY_BOUNDS):
                return lo
            return lo + (LATENCY_BOUNDS[i] - lo) * max(0.0, rank - acc) / c
        acc += c
    return LATENCY_BOUNDS[-1]


def story_summary(story: Iterable[tuple[int, Event]]) -> dict[str, Any]:
    """One call's story condensed: service, user, server, state, times."""
    out: dict[str, Any] = {"state": "unknown"}
    for _, e in story:
        for f in ("service", "user"):
            if getattr(e, f) and f not in out:
                out[f] = getattr(e, f)
        if e.optional:
            out["optional"] = True
        k = e.kind
        if k is EventKind.DISCOVERY_ASKED:
            out.setdefault("asked", e.time)
            out["state"] = "discovering"
        elif k is EventKind.DISCOVERY_ANSWERED:
            out["chosen"] = e.server
            out["state"] = "discovered"
        elif k is EventKind.DISCOVERY_FAILED:
            out["state"] = "discovery_failed"
            out["error"] = e.detail
        elif k is EventKind.CALL_QUEUED:
            out["server"] = e.server or e.element
            out["queued"] = e.time
            out["state"] = "queued"
        elif k is EventKind.CALL_STARTED:
            out["started"] = e.time
            out["wait"] = e.duration
            out["state"] = "running"
        elif k in TERMINAL:
            out["ended"] = e.time
            out["run"] = e.duration
            out["state"] = OUTCOME[k]
            if e.detail:
                out["error"] = e.detail
        elif k is EventKind.JOB_STATE:
            out["job_state"] = e.detail
    return out
