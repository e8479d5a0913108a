"""Pending discoveries of one agent (pure).

A discovery fans out to the children offering the service; their answers are
collected until all answered or the deadline passed; then the aggregator ranks
the union and the best k go back. One slow or dead branch only costs the
deadline, never blocks the answer.
"""
from __future__ import annotations

import bisect
import collections
import heapq
import random
from dataclasses import dataclass, field

from .aggregators import Aggregator


@dataclass(slots=True)
class Pending:
    id: str
    reply_to: object                # opaque to the core (route + header id of the asker)
    waiting: set[str]
    k: int
    aggregator: Aggregator
    deadline: float
    servers: list[dict] = field(default_factory=list)
    answered: int = 0
    started: float = 0.0


@dataclass(frozen=True, slots=True)
class Done:
    id: str
    reply_to: object
    servers: list
    answered: int
    timed_out: list


#: seconds the root remembers a first choice (DiscoveryTable): its answers show the choice as a
#: waiting call until a snapshot taken after it arrives, at most this long
CHOICE_MEMORY = 1.0


class DiscoveryTable:
    """``remember`` (for the root agent): recent first choices are remembered
    for ``memory`` seconds and shown to the aggregator as load — the chosen
    server's ``time_since_last_solve`` restarts and its ``num_waiting`` grows —
    so concurrent discoveries, answered before any call reached the chosen
    SeD, spread over the servers instead of all picking the same one. A
    call shorter than the SeD's push coalescing leaves no snapshot behind
    it, so its choice is shown as a waiting call for the whole memory after
    the call ended (clients discount what their own recent calls explain,
    gridrpc.client.reuse)."""

    def __init__(self, rng: random.Random, remember: bool = False, memory: float = CHOICE_MEMORY) -> None:
        self.rng = rng
        self.pending: dict[str, Pending] = {}
        self.remember = remember
        self.memory = memory
        self.recent: dict[str, collections.deque] = {}
        self.watchers: list = []        # told of every choice (``changed(name)``): the view's kept rankings
        self._last_sweep = 0.0
        self._deadlines: list[tuple[float, str]] = []     # heap; entries of finished ones dropped lazily

    def start(self, id_: str, reply_to: object, children: list[str], k: int,
              aggregator: Aggregator, deadline: float, now: float = 0.0) -> Done | None:
        p = Pending(id=id_, reply_to=reply_to, waiting=set(children), k=k,
                    aggregator=aggregator, deadline=deadline, started=now)
        if not p.waiting:
            return self._finish(p, now)
        self.pending[id_] = p
        heapq.heappush(self._deadlines, (deadline, id_))
        return None

    def answer(self, id_: str, child: str, servers: list[dict], now: float = 0.0,
               names: list | None = None) -> Done | None:
        """``names``: the children this one answer speaks for (replicas of one
        SeD process answer together); default just ``child``."""
        p = self.pending.get(id_)
        covered = [n for n in (names if names else [child]) if n in p.waiting] if p else []
        if not covered:
            return None            # late or duplicate answer
        for n in covered:
            p.waiting.discard(n)
        p.answered += len(covered)
        p.servers.extend([s for s in servers if isinstance(s, dict) and "name" in s])
        if not p.waiting:
            del self.pending[id_]
            return self._finish(p, now)
        return None

    def drop(self, id_: str, children: list, now: float = 0.0) -> Done | None:
        """The request never reached ``children`` (the send failed): stop
        waiting for them, without counting them as answered or timed out."""
        p = self.pending.get(id_)
        if p is None:
            return None
        for n in children:
            p.waiting.discard(n)
        if not p.waiting:
            del self.pending[id_]
            return self._finish(p, now)
        return None

    def child_lost(self, child: str, now: float = 0.0) -> list[Done]:
        out = []
        for id_ in [i for i, p in self.pending.items() if child in p.waiting]:
            p = self.pending[id_]
            p.waiting.discard(child)
            if not p.waiting:
                del self.pending[id_]
                out.append(self._finish(p, now))
        return out

    def expire(self, now: float) -> list[Done]:
        """Finish the discoveries whose deadline is ``<= now``, earliest first."""
        out = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, id_ = heapq.heappop(heap)
            p = self.pending.get(id_)
            if p is not None and p.deadline == deadline:
                del self.pending[id_]
                out.append(self._finish(p, now))
        return out

    def next_deadline(self) -> float | None:
        heap = self._deadlines
        while heap and heap[0][1] not in self.pending:     # finished before its deadline
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _finish(self, p: Pending, now: float) -> Done:
        servers = self._with_recent(p.servers, now) if self.remember else p.servers
        ranked = p.aggregator.rank(servers, self.rng)[: p.k] if servers else []
        if ranked:
            self.remember_choice(ranked[0]["name"], now)
        return Done(id=p.id, reply_to=p.reply_to, servers=ranked, answered=p.answered,
                    timed_out=sorted(p.waiting))

    def remember_choice(self, name: str, now: float) -> None:
        """A first choice made elsewhere (an answer from the view)."""
        if self.remember:
            self.recent.setdefault(name, collections.deque()).append(now)
            for w in self.watchers:
                w.changed(name)

    def sweep(self, now: float) -> None:
        """Now and then (every ``memory`` seconds), forget the servers not
        chosen within the memory."""
        if now - self._last_sweep > self.memory:
            self._last_sweep = now
            horizon = now - self.memory
            for name in list(self.recent):
                self._recent_times(name, horizon)

    def with_recent_since(self, servers: list[dict], now: float) -> list[dict]:
        """As :meth:`_with_recent`, for snapshots of the view: a server's
        ``_at`` (when its snapshot was taken) hides the choices made before
        it (the snapshot already shows their calls). Drops ``_at``."""
        horizon = now - self.memory
        out = []
        for s in servers:
            at = s.pop("_at", None)
            ts = self._recent_times(s["name"], horizon) if self.remember else ()
            n = _count_after(ts, at) if ts else 0
            if n:
                est = dict(s["estimation"]) if isinstance(s.get("estimation"), dict) else {}
                since = now - ts[-1]
                tsls = est.get("time_since_last_solve")
                est["time_since_last_solve"] = since if not isinstance(tsls, (int, float)) else min(tsls, since)
                nw = est.get("num_waiting")
                est["num_waiting"] = (nw if isinstance(nw, (int, float)) and not isinstance(nw, bool) else 0) + n
                s["estimation"] = est
            out.append(s)
        return out

    def _recent_times(self, name: str, horizon: float):
        ts = self.recent.get(name)
        if ts is None:
            return ()
        while ts and ts[0] < horizon:          # times are appended in order: drop from the left
            ts.popleft()
        if not ts:
            del self.recent[name]
            return ()
        return ts

    def _with_recent(self, servers: list[dict], now: float) -> list[dict]:
        horizon = now - self.memory
        self.sweep(now)                 # now and then, forget servers never ranked again
        out = []
        for s in servers:
            ts = self._recent_times(s["name"], horizon)
            if ts:
                est = dict(s["estimation"]) if isinstance(s.get("estimation"), dict) else {}
                since = now - ts[-1]
                tsls = est.get("time_since_last_solve")
                est["time_since_last_solve"] = since if not isinstance(tsls, (int, float)) else min(tsls, since)
                nw = est.get("num_waiting")
                est["num_waiting"] = (nw if isinstance(nw, (int, float)) and not isinstance(nw, bool)
                                      else 0) + len(ts)
                s = {**s, "estimation": est}
            out.append(s)
        return out


def _count_after(ts, at: float | None) -> int:
    """How many of the (ascending) times ``ts`` are after ``at`` (all when
    None), by bisection: a Python loop over every choice of the memory was
    the MA's biggest cost per view answer at 1,000 discoveries/s."""
    if at is None:
        return len(ts)
    return len(ts) - bisect.bisect_right(ts, at)     # a deque indexes in C: log n probes


def joined_ranking(entries: list, j: int) -> list:
    """The ranking the ``j``-th client joining a shared discovery gets: the
    asker's, rotated by ``j`` places (``j`` = 0: the asker's own), so users
    who got one answer do not all put their first calls on the same servers."""
    if not entries:
        return entries
    j %= len(entries)
    return entries[j:] + entries[:j]
