"""A client's short memory of the master agent's view answers
(``ClientOptions.reuse_discovery``).

A discovery answered from the MA's pushed view does not depend on the
call's arguments, only on the servers' state, which the MA itself only knows
to within its view's freshness. For ``window`` seconds after such an answer a
call of the same service (same number of candidates, aggregator and kind)
takes its candidates from the answer instead of asking the MA again: the
call with discovery then costs what a bound call costs (Ray reuses a worker
lease for the same scheduling class the same way; Sparrow's schedulers
decide from pushed state).

So that the calls made from one answer do not all land on its first server,
the answer is ranked again for every call by each server's load: the calls
its estimation showed plus those this client has sent it since and that
are still in flight, per slot (ties keep the MA's order). A sequential
caller gets the MA's first choice each time; a burst spreads over the
answer's servers as their slots allow, and once none has a free slot left
(by this client's count) the next call asks the MA again, which knows the
other servers — unless the answer showed no free slot when it came (the
tree is saturated: the MA could only name queues too). A kept
answer that has gone stale is corrected by the call itself: when it showed
the first server free, the call is sent as a probe (late binding,
:mod:`gridrpc.core.call`) and a busy server passes it to the next one.

Only answers the MA marked as coming from its view are kept (a fan-out's
answer may depend on the request); a call that left a server for a
failure (its failover) or failed for a server's or the network's reason
(``server_failed``; not the service's own error) forgets every kept answer
when it ends.
Pure: the caller gives ``now``.
"""
from __future__ import annotations

from typing import Any, Hashable, Sequence

import orjson

from ..core.call_types import Fail
from ..core.tally import tally

__all__ = ["ReusedAnswers", "MAX_KEPT", "FORGET_KINDS", "load", "answer_key", "server_failed"]

#: failures of a call after which the kept answers are forgotten (a server or the network failed)
FORGET_KINDS = frozenset({"communication", "server_lost", "worker_died", "timeout", "no_server",
                          "service_not_found", "refused"})

#: answers kept at most (one per service, aggregator, ...): the oldest go first
MAX_KEPT = 256


def answer_key(service: str, optional: bool, k: int, aggregator: Any) -> tuple:
    """What a kept answer must match: service, kind, candidates, aggregator."""
    if aggregator is not None and not isinstance(aggregator, str):
        aggregator = orjson.dumps(aggregator, option=orjson.OPT_SORT_KEYS)
    return (service, bool(optional), int(k), aggregator)


def server_failed(machine: Any, outcome: Any) -> bool:
    """Whether a call's end must forget the kept answers: its machine left a
    server for a failure (a failover; a busy probe passing it on is not one),
    or it failed for a server's or the network's reason (``FORGET_KINDS``)."""
    return (machine is not None and bool(machine.excluded)) or (
        type(outcome) is Fail and outcome.error.kind in FORGET_KINDS)


def load(server: Any, flying: int) -> float:
    """Calls per slot on ``server``: those its estimation showed (running and
    waiting, over ``max_concurrent``) plus ``flying`` of this client's; without
    those fields, ``flying``."""
    est = getattr(server, "estimation", None)
    if type(est) is dict:
        running, slots, waiting = est.get("num_running"), est.get("max_concurrent"), est.get("num_waiting", 0)
        if type(running) is int and type(slots) is int and type(waiting) is int and slots > 0:
            return (max(0, running) + max(0, waiting) + flying) / slots
    return float(flying)


class ReusedAnswers:
    """Kept view answers, and this client's calls in flight per server name."""

    __slots__ = ("window", "kept", "in_flight", "reused", "asked")

    def __init__(self, window: float) -> None:
        if not window > 0:
            raise ValueError(f"reuse window must be > 0 s, not {window!r}")
        self.window = float(window)
        self.kept: dict[Hashable, tuple[float, list, bool]] = {}      # key -> (when, servers, saturated)
        self.in_flight: dict[str, int] = {}
        self.reused = 0             # calls that took a kept answer
        self.asked = 0              # answers kept

    def take(self, key: Hashable, now: float) -> list | None:
        """The kept answer for ``key``, ranked again for this call, or None:
        none kept, older than the window (forgotten), or no free slot left
        on its servers by this client's count while the answer showed one
        (``fits``: the MA knows other servers)."""
        got = self.kept.get(key)
        if got is None:
            return None
        at, servers, saturated = got
        if now - at > self.window or now < at:
            del self.kept[key]
            return None
        ranked = self.rerank(servers)
        if not self.fits(ranked, saturated):
            return None
        self.reused += 1
        return ranked

    def fits(self, ranked: Sequence[Any], saturated: bool) -> bool:
        """Whether an answer ranked for this call (``rerank``) serves it: its
        first server has a free slot, or the answer showed none free when it
        came (a saturated tree: the MA could only name queues too)."""
        return bool(ranked) and (saturated or load(ranked[0], self.in_flight.get(ranked[0].name, 0)) < 1)

    def saturated(self, servers: Sequence[Any]) -> bool:
        """No server of the answer has a free slot (by its estimation and
        this client's calls in flight)."""
        flying = self.in_flight
        return all(load(s, flying.get(s.name, 0)) >= 1 for s in servers)

    def rerank(self, servers: Sequence[Any]) -> list:
        """``servers`` (best first) ordered by their load as the answer showed
        it plus this client's calls in flight on them, per slot (``load``);
        a stable sort: ties keep the MA's order."""
        flying = self.in_flight
        if not flying:
            return list(servers)
        order = sorted(range(len(servers)), key=lambda i: (load(servers[i], flying.get(servers[i].name, 0)), i))
        return [servers[i] for i in order]

    def keep(self, key: Hashable, servers: Sequence[Any], now: float, saturated: bool | None = None) -> None:
        """Keep a view answer (``saturated``: ``self.saturated(servers)``, when the caller has it)."""
        if not servers:
            return
        self.kept.pop(key, None)
        if len(self.kept) >= MAX_KEPT:
            del self.kept[next(iter(self.kept))]
        self.kept[key] = (now, list(servers), self.saturated(servers) if saturated is None else saturated)
        self.asked += 1

    def answered(self, key: Hashable | None, servers: Sequence[Any], from_view: bool, now: float) -> list:
        """A fresh answer, for the call that asked: kept when the MA gave it
        from its view (and the call has a ``key``), ranked for that call."""
        if key is not None and from_view:
            self.keep(key, servers, now)
        return self.rerank(servers)

    def begin(self, ranked: Sequence[Any]) -> str:
        """The call goes to the first of ``ranked``: counted in flight there; its name."""
        name = ranked[0].name
        self.started(name)
        return name

    def started(self, name: str) -> None:
        tally(self.in_flight, name, 1)

    def ended(self, name: str, failed: bool = False) -> None:
        tally(self.in_flight, name, -1)
        if failed:
            self.kept.clear()

    def forget(self) -> None:
        self.kept.clear()
