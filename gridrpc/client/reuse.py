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
the answer is ranked again for every call by each server's load (``load``),
per slot, ties in the MA's order: this client's calls in flight there, plus
the calls the answer's estimation showed that this client's own recent
calls there (in flight, or ended lately: within ``SHOWN_MEMORY``, or the
MA's choice memory for a call that asked the MA; when the answer came:
``mine``) do not explain. The calls this client makes from the
answer are not among them: counted when the answer came, a server's load
does not fall as this client's calls from the answer end there (it would
look free after a few calls of a window, and the next one would probe a
full server). The estimation often shows this client's own calls: the servers
push every change within milliseconds, a push coalesced over short calls
may show one that has ended, and the MA shows its recent choices as waiting
calls until a newer snapshot comes, which a call shorter than the push
coalescing never sends (``gridrpc.core.discovery.CHOICE_MEMORY``).
Counted again, they would make a burst that follows sequential calls
leave a free server out and put a third call on another. A sequential caller gets the
MA's first choice each time (the first server the answer showed free, when
the MA's first showed none); a burst spreads over the answer's servers as
their slots allow, and once none has a free slot left (by that count) the
next call asks the MA again, which knows the other servers — unless the
answer showed no free slot when it came (the tree is saturated: the MA
could only name queues too); the calls then queue on its servers, least
loaded first, so that N calls on M full single-slot servers put at most
ceil(N/M) on each. Such a saturated answer also serves past the window, up
to ``SATURATED_REUSE`` after it came, a client that calls one call at a
time back to back (none in flight, the last ended within the window) while,
by that count, every server of it is still full (a burst asks the MA, whose
view may show slots the old answer did not): a free slot is taken within milliseconds,
so an answer's free servers are trusted for the window only, while the
queues of a saturated tree change slowly and its calls would all queue
anyway, while a DISCOVER costs the MA and the client more CPU than a
short call itself (docs/performance.md, "Load generation"). A
client that paused asks the MA again: the load that saturated the tree may
be gone. Calls that wait for one discovery together ask for as
many servers as they are, plus as many as this client has calls on
(``ask_for``, at most ``MAX_ASK``), so a burst is shown every server it
can use, not the first ``k``; each call still gets ``k`` candidates.

Where a call goes is decided by the servers (late binding,
:mod:`gridrpc.core.client_call.machine`): a call whose first server is free by that count
is sent to it as a probe, and a server that cannot start it at once passes
it to the next candidate, so a count that is wrong (another client's calls
taken for this client's, an answer gone stale) costs a round trip, not a
call parked in a queue behind a server while another is free. That holds
also when every other candidate looks full: the count cannot see how long
the call that took the first server's slot will run (a bound call, another
client's), and a call queued blind behind a long one waits for all of it.
A call whose first server is full of this client's own calls is queued
there, not probed (``Discovered.first_free``). A call is counted
where it went (``moved``), not where its answer put it first.

Only answers the MA marked as coming from its view are kept (a fan-out's
answer may depend on the request); a call that left a server for a
failure (its failover) or failed for a server's or the network's reason
(``server_failed``; not the service's own error) forgets every kept answer
when it ends.
Pure: the caller gives ``now``.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable, Hashable, Sequence

import orjson

from ..core.client_call.vocabulary import Fail
from ..core.discovery import CHOICE_MEMORY
from ..core.view import SLOW_PUSH_INTERVAL
from ..core.tally import tally

__all__ = ["ReusedAnswers", "MAX_KEPT", "MAX_ASK", "SATURATED_REUSE", "FORGET_KINDS", "load", "ask_for",
           "answer_key", "server_failed", "ask_again"]

#: failures of a call after which the kept answers are forgotten (a server or the network failed)
FORGET_KINDS = frozenset({"communication", "server_lost", "worker_died", "timeout", "no_server",
                          "service_not_found", "refused", "unavailable"})

#: answers kept at most (one per service, aggregator, ...): the oldest go first
MAX_KEPT = 256

#: servers one discovery asks for at most (``ask_for``; more only when ``max_candidates`` is more):
#: every call re-ranks the kept answer, so its size is paid on each call of the window
MAX_ASK = 16

#: seconds after it came that an answer which showed no free slot (a saturated tree) serves, past the
#: window, a client calling one call at a time back to back while every server of it stays full by the client's count
#: (``ReusedAnswers.take``); the MA's choice memory (``CHOICE_MEMORY``) has the same length
SATURATED_REUSE = 1.0
#: seconds after it ended that this client's call may still be shown in a server's estimation: the
#: server coalesces its pushes over ``SLOW_PUSH_INTERVAL`` under load, its agents do the same on the
#: way up; three of those cover the way to the MA and its answer
SHOWN_MEMORY = 3 * SLOW_PUSH_INTERVAL


def ask_for(k: int, calls: int, taken: int = 0) -> int:
    """Servers to ask the MA for when ``calls`` calls, each wanting ``k``
    candidates, wait for one discovery while this client has calls in
    flight on ``taken`` servers: one per waiting call and one per such
    server, at least ``k``, at most ``MAX_ASK`` unless ``k`` is more. The
    MA does not see this client's latest calls, so its best servers may be
    the ones those calls fill; asking for as many more shows the waiting
    calls the servers beyond them (a burst submitted one call at a time,
    whose calls find the last answer's servers full one after the other, is
    shown every server, not the same first ``k`` again)."""
    return max(k, min(calls + taken, MAX_ASK))


def ask_again(joining: dict, key: Hashable, again: list) -> Any:
    """The calls an answer could not seat (``ReusedAnswers.settle``) ask the
    MA again as one discovery: when one for ``key`` is already out
    (``joining[key]``) they all join it and None is returned; else the first
    is returned to ask, and the others wait in ``joining[key]`` to join it
    (each asking alone would be a DISCOVER per call after every answer that
    came with a free slot). None too when ``again`` is empty."""
    if not again:
        return None
    waiting = joining.get(key)
    if waiting is not None:
        waiting.extend(again)
        return None
    joining[key] = again[1:]
    return again[0]


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


def load(server: Any, flying: int, ended: int = 0, mine: int | None = None) -> float:
    """Calls per slot on ``server``: ``flying``, this client's calls in
    flight there, plus those its estimation showed (running and waiting,
    over ``max_concurrent``) beyond what this client's own recent calls
    there explain (``mine`` when given: those the estimation may show,
    counted when the answer came; else ``flying`` and ``ended``: its calls
    there that ended lately); without those fields, ``flying``.

    Taking another client's call for one of this client's makes a server
    look free when it is not: the call probes it and moves on (late
    binding). Counting this client's calls twice would make a free server
    look full, and the call queue elsewhere."""
    est = getattr(server, "estimation", None)
    if type(est) is dict:
        running, slots, waiting = est.get("num_running"), est.get("max_concurrent"), est.get("num_waiting", 0)
        if type(running) is int and type(slots) is int and type(waiting) is int and slots > 0:
            others = max(0, running) + max(0, waiting) - (flying + ended if mine is None else mine)
            return (flying + others if others > 0 else flying) / slots
    return float(flying)


class ReusedAnswers:
    """Kept view answers, this client's calls in flight per server name, and
    when its calls there ended lately (within ``CHOICE_MEMORY``: what the
    MA's answers and the servers' coalesced pushes may still show).
    ``now``: the caller's clock; left out, ended calls are not counted."""

    __slots__ = ("window", "saturated_window", "kept", "in_flight", "choices", "ended_at", "chosen_at", "last_end",
                 "reused", "asked",
                 "_last")

    def __init__(self, window: float) -> None:
        if not window > 0:
            raise ValueError(f"reuse window must be > 0 s, not {window!r}")
        self.window = float(window)
        self.saturated_window = max(self.window, SATURATED_REUSE)
        # key -> (when, servers, saturated, mine: this client's calls per server that the answer may show)
        self.kept: dict[Hashable, tuple[float, list, bool, dict]] = {}
        self.in_flight: dict[str, int] = {}
        self.choices: dict[str, int] = {}       # calls in flight per server that took the MA's first choice
        self.ended_at: dict[str, deque] = {}    # server -> when this client's calls there ended, oldest first
        self.chosen_at: dict[str, deque] = {}   # the same for the calls that took the MA's first choice
        self.last_end = -math.inf   # when this client's last call ended (any server)
        self.reused = 0             # calls that took a kept answer
        self.asked = 0              # answers kept
        self._last: tuple = (None, ())      # rerank's last list and its servers' loads, in its order

    def take(self, key: Hashable, now: float) -> list | None:
        """The kept answer for ``key``, ranked again for this call, or None:
        none kept, older than the window (forgotten: the MA knows better by
        now), or no free slot left on its servers by this client's count
        while the answer showed one (``fits``: the MA knows other servers).
        A saturated answer serves past the window, up to ``SATURATED_REUSE``,
        while this client calls one call at a time back to back
        (``one_after_another``) and every server
        of it is full by the count (``free``)."""
        got = self.kept.get(key)
        if got is None:
            return None
        at, servers, saturated, mine = got
        age = now - at
        if now < at or age > self.window and not (saturated and age <= self.saturated_window
                                                  and self.one_after_another(now)):
            del self.kept[key]
            return None
        ranked = self.rerank(servers, now, mine)
        if age > self.window:
            if self.free(ranked, now):          # a free slot by the count, shown too long ago to trust
                del self.kept[key]
                return None
        elif not self.fits(ranked, saturated, now):
            return None
        self.reused += 1
        return ranked

    def one_after_another(self, now: float) -> bool:
        """Whether this client calls one call at a time, back to back: none
        in flight, the last one ended within the window before ``now``. A
        burst (calls in flight) does not take a saturated answer past the
        window: it asks the MA, whose view may show slots the old answer
        did not, so its calls spread instead of queueing where that answer
        showed the shortest queues."""
        return not self.in_flight and now - self.last_end <= self.window

    def load(self, server: Any, now: float | None = None, mine: dict | None = None) -> float:
        """``load`` of ``server`` by this client's count (``mine``: the
        answer's, see :meth:`mine`; else counted at ``now``)."""
        name = server.name
        if mine is not None:
            return load(server, self.in_flight.get(name, 0), mine=mine.get(name, 0))
        return load(server, self.in_flight.get(name, 0), 0 if now is None else self.recent(name, now))

    def mine(self, servers: Sequence[Any], now: float) -> dict[str, int]:
        """Per server of an answer that comes at ``now``: this client's calls
        there that its estimation may show (in flight, or ended lately:
        :meth:`recent`); a call this client makes later is not among them."""
        flying = self.in_flight
        return {s.name: flying.get(s.name, 0) + self.recent(s.name, now) for s in servers}

    def recent(self, name: str, now: float) -> int:
        """This client's calls on ``name`` that its server's pushes or the
        MA may still show: those that ended within ``SHOWN_MEMORY`` before
        ``now``, and those that took the MA's first choice and ended within
        ``CHOICE_MEMORY`` (the MA shows its choice as a waiting call until a
        newer snapshot of that server comes, which a short call may never
        cause)."""
        return (_within(self.ended_at, name, now - SHOWN_MEMORY)
                + _within(self.chosen_at, name, now - CHOICE_MEMORY))

    def fits(self, ranked: Sequence[Any], saturated: bool, now: float | None = None) -> bool:
        """Whether an answer ranked for this call (``rerank``) serves it: its
        first server has a free slot, or the answer showed none free when it
        came (a saturated tree: the MA could only name queues too)."""
        return bool(ranked) and (saturated or self.free(ranked, now))

    def free(self, ranked: Sequence[Any], now: float | None = None) -> bool:
        """Whether the first of ``ranked`` has a free slot by this client's
        count, before the call is counted there."""
        last = self._last                   # (the list rerank returned last, its servers' loads)
        if last[0] is ranked:
            return last[1][0] < 1
        return self.load(ranked[0], now) < 1

    def saturated(self, servers: Sequence[Any], now: float | None = None, mine: dict | None = None) -> bool:
        """No server of the answer has a free slot (by its estimation and
        this client's calls)."""
        return all(self.load(s, now, mine) >= 1 for s in servers)

    def rerank(self, servers: Sequence[Any], now: float | None = None, mine: dict | None = None) -> list:
        """``servers`` (best first) ordered by their load by this client's
        count (``load``; ``mine``: the answer's, see :meth:`mine`); a stable
        sort: ties keep the MA's order. With nothing of this client in
        flight the MA's order stands, unless its first server shows no free
        slot while another does (the MA's aggregator need not rank by load,
        e.g. least recently used first): then a free one comes first, so an
        answer kept as not saturated serves the next call."""
        loads = [self.load(s, now, mine) for s in servers]
        if not self.in_flight and (not loads or loads[0] < 1 or min(loads) >= 1):
            ranked = list(servers)
            self._last = (ranked, loads)
            return ranked
        order = sorted(range(len(servers)), key=loads.__getitem__)     # stable: ties in the MA's order
        ranked = [servers[i] for i in order]
        self._last = (ranked, [loads[i] for i in order])
        return ranked

    def keep(self, key: Hashable, servers: Sequence[Any], now: float, saturated: bool | None = None,
             mine: dict | None = None) -> None:
        """Keep a view answer that came at ``now`` (``saturated``, ``mine``:
        ``self.saturated(servers, now, mine)`` and ``self.mine(servers, now)``,
        when the caller has them)."""
        if not servers:
            return
        if mine is None:
            mine = self.mine(servers, now)
        if saturated is None:
            saturated = self.saturated(servers, now, mine)
        self.kept.pop(key, None)
        if len(self.kept) >= MAX_KEPT:
            del self.kept[next(iter(self.kept))]
        self.kept[key] = (now, list(servers), saturated, mine)
        self.asked += 1

    def settle(self, key: Hashable | None, servers: Sequence[Any], from_view: bool, now: float,
               calls: Sequence[tuple[Any, Any]], asker: Any, seat: Callable[[Any, list], None]) -> list:
        """A discovery's answer ``servers`` for the calls waiting on it
        (``calls``: ``(flight, its Discover)``, the one that asked, ``asker``,
        first): kept when the MA gave it from its view (and it has a
        ``key``); each call in turn gets it ranked for itself (``seat(flight,
        ranked)`` counts it in flight at once, so the next call sees it);
        an answer for data arguments (no ``key``) keeps its order, ranked
        by where the data is. Returns the calls other than the asker whose
        first server has no free slot left: they ask the MA again."""
        mine = self.mine(servers, now)
        saturated = self.saturated(servers, now, mine)
        if key is not None and from_view:
            self.keep(key, servers, now, saturated, mine)
        again = []
        for f, own in calls:
            if f.machine.finished:
                continue
            ranked = self.rerank(servers, now, mine) if key is not None else list(servers)
            if f is not asker and not self.fits(ranked, saturated, now):
                again.append((f, own))          # the answer's servers are taken by the calls before
                continue
            seat(f, ranked)
            if f is asker and ranked:
                self.chose(ranked[0].name)
        return again

    def answered(self, key: Hashable | None, servers: Sequence[Any], from_view: bool, now: float) -> list:
        """A fresh answer, for the call that asked: kept when the MA gave it
        from its view (and the call has a ``key``), ranked for that call."""
        mine = self.mine(servers, now)
        if key is not None and from_view:
            self.keep(key, servers, now, mine=mine)
        return self.rerank(servers, now, mine)

    def begin(self, ranked: Sequence[Any]) -> str:
        """The call goes to the first of ``ranked``: counted in flight there; its name."""
        name = ranked[0].name
        self.started(name)
        return name

    def started(self, name: str) -> None:
        tally(self.in_flight, name, 1)

    def chose(self, name: str) -> None:
        """The call in flight on ``name`` is the one that asked the MA: its
        end is remembered for ``CHOICE_MEMORY``, not ``SHOWN_MEMORY``."""
        tally(self.choices, name, 1)

    def moved(self, old: str, new: str) -> None:
        """A call counted on ``old`` was sent to ``new`` instead (a busy
        probe passed it on, or a failover): counted there now."""
        tally(self.in_flight, old, -1)
        tally(self.in_flight, new, 1)
        if self.choices.get(old, 0) > 0:
            tally(self.choices, old, -1)
            tally(self.choices, new, 1)

    def ended(self, name: str, failed: bool = False, now: float | None = None) -> None:
        """A call on ``name`` ended (``failed``: for a server's or the
        network's reason: every kept answer is forgotten)."""
        tally(self.in_flight, name, -1)
        chosen = self.choices.get(name, 0) > 0
        if chosen:
            tally(self.choices, name, -1)
        if now is not None:
            self.last_end = now
            book, memory = (self.chosen_at, CHOICE_MEMORY) if chosen else (self.ended_at, SHOWN_MEMORY)
            _within(book, name, now - memory)       # drop what is too old to be shown, whoever asks
            times = book.get(name)
            if times is None:
                times = book[name] = deque()
            times.append(now)
        if failed:
            self.kept.clear()

    def forget(self) -> None:
        self.kept.clear()


def _within(book: dict, name: str, horizon: float) -> int:
    """How many times of ``book[name]`` are at or after ``horizon``; older ones are dropped."""
    times = book.get(name)
    if times is None:
        return 0
    while times and times[0] < horizon:
        times.popleft()
    if not times:
        del book[name]
        return 0
    return len(times)
