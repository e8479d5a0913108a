"""The fair optional-computation queue ("DIET-ethic"), as a :class:`QueuePolicy`.

Klein-Halmaghi (PhD thesis, 2012, ch. 7) and INRIA RR-7959: users submit
*mandatory* requests (they need ``n_min`` results) and *optional* ones (nice to
have before the deadline). Each SeD orders its requests by these rules, in
order of precedence:

1. mandatory before optional;
2. started (running) before waiting, so work is not wasted;
3. mandatory among themselves by submit time (FCFS, then arrival ``seq``);
4. by the server-seconds already allocated to the request's user on this SeD
   (least served first; the ``allocated`` mapping includes the elapsed time of
   running requests);
5. remaining ties at random, with the runtime's seeded ``rng``, so that
   different SeDs favour different users.

The :class:`~gridrpc.core.queue.SedScheduler` runs the first
``max_concurrent`` requests of the order and kills running requests that fall
out of it.

Trade-offs
----------
* **Who can be killed.** Rules 1 and 2 together give the order
  ``[running mandatory, waiting mandatory, running optional, waiting optional]``.
  A running mandatory request is therefore never preempted, and a running
  optional request is preempted *only* by a waiting mandatory one: a waiting
  optional request never outranks a running one. So there is no thrashing
  between optional requests — two users with equal allocation cannot kill each
  other's requests back and forth, whatever the random tie-break draws. The
  price is that fairness between optional requests is only enforced when a
  slot frees up (it is not preemptive): a user who got a slot keeps it until
  the request ends.
* **Which optional request dies.** When a mandatory request must take a slot
  from several running optional ones, the victim is the last of them in the
  order, i.e. the one whose user has received the most on this SeD (elapsed
  time of running requests counts). That is the fair choice, but it may kill
  a request that was about to finish — the policy does not know run times.
  Killed work still counts as allocated to its user (as in the metrics), and
  the client resubmits the request.
* **Random tie-break.** Keys are redrawn at every re-evaluation; stability is
  not needed because (see above) the draw can only reorder waiting optional
  requests among themselves, or choose which of equally-served running
  optional requests is killed. Requests of one user are not kept in FCFS order
  among themselves; for identical optional work that does not matter.
* **Grace before preemption** (``kill_grace`` seconds, default 0 = the paper's
  behaviour). A waiting mandatory request younger than ``kill_grace`` (by its
  ``submitted`` time) does not preempt running optional requests: it ranks
  after them but still before every waiting optional request, so it takes the
  first slot that frees naturally. Once older than ``kill_grace`` it preempts
  as usual. This trades a bounded delay of mandatory work for less wasted
  optional work when request durations are short compared to ``kill_grace``.
  The scheduler only re-evaluates on events, so a runtime using a grace must
  also re-evaluate at :meth:`EthicPolicy.next_wakeup` (see that method).
* **Accounting for rule 4** (``accounting``). ``"cumulative"`` (default, the
  paper's wording): a user's allocation on this SeD since the SeD started.
  A user who arrives late starts at 0 and so takes *every* freed slot until
  it has caught up with users who have been served for a while, who get
  nothing meanwhile; with staggered arrivals (the day scenarios) early users
  end far below their deserved share and late ones far above (a pure
  simulation of day-regular gives unfairness ≈ 0.9, worse than the legacy
  baseline). ``"virtual"``: start-time fair queuing — the SeD keeps a
  virtual time (the least effective allocation of the users present, never
  decreasing) and a user that (re)appears in the queue starts at
  ``max(its own effective allocation, virtual time)``, so a newcomer shares
  slots equally with the users present from its arrival on instead of being
  owed the past. That is the equal share of the present users that the
  fairness metric's ``deserved`` counts. It keeps per-user state in the
  policy object (one policy per SeD replica), bounded by forgetting users
  absent for ``forget_after`` seconds. A user absent for at most
  ``rejoin_grace`` seconds (1 s by default; 0 gives the earlier rule, where
  any evaluation without the user made it arrive anew) is not levelled: a
  client sends its next optional request to a SeD when the previous one
  ends, so each user is absent for a round trip after each request, and the
  least served user — the one rule 4 should serve next — lost its deficit at
  every such return.
* **Gathering a burst** (``gather`` seconds, default 0 = the paper's
  behaviour; ``gather_max``, default 0.5 s). An idle SeD (nothing running)
  whose waiting requests are all optional starts none of them while
  optional requests keep arriving less than ``gather`` apart, and at most
  ``gather_max`` (default ``max(0.5, gather)``) after the first that arrived
  while it was idle (requests that waited through a busy period are ranked
  at once when it ends): users who arrive together are then ranked
  together (rules 1-5) instead of in the order the SeD happened to read
  them. Without it, the user whose calls are read first takes every idle
  SeD, and the others' mandatory requests, read a few milliseconds later,
  preempt it everywhere (in the 138-SeD, 100-user scale run: 237 kills,
  most of them of that one user, whose killed time then counts as received).
  A mandatory request is never held, and a SeD that runs something never
  holds. The runtime re-evaluates at :meth:`EthicPolicy.next_wakeup`.
* **Data structure.** A SeD queue holds tens of requests and, more to the
  point, rule 4's keys change with ``now`` (running requests accumulate
  allocation) and rule 5's are redrawn on every evaluation, so a persistent
  ``sortedcontainers.SortedList`` would have to be rebuilt from scratch each
  time anyway. Computing the keys and calling :func:`sorted` on the small list
  (O(n log n), stable) is simpler and at least as fast.
"""
from __future__ import annotations

import heapq
import random
from typing import ClassVar, Iterable, Mapping, Sequence

from .queue import Request, register_policy

# Rank classes (rules 1 and 2, plus the grace class).
_RUNNING_MANDATORY = 0
_WAITING_MANDATORY = 1
_RUNNING_OPTIONAL = 2
_WAITING_MANDATORY_IN_GRACE = 3
_WAITING_OPTIONAL = 4


@register_policy
class EthicPolicy:
    """Mandatory first, running before waiting, mandatory FCFS, least-served
    user first, random ties. See the module docstring for the trade-offs."""
    name: ClassVar[str] = "ethic"

    ACCOUNTING: ClassVar[tuple[str, ...]] = ("cumulative", "virtual")

    def __init__(self, kill_grace: float = 0.0, accounting: str = "cumulative",
                 forget_after: float = 3600.0, rejoin_grace: float = 1.0,
                 gather: float = 0.0, gather_max: float | None = None) -> None:
        kill_grace = float(kill_grace)
        if not kill_grace >= 0.0:          # also rejects NaN
            raise ValueError(f"kill_grace must be >= 0, got {kill_grace!r}")
        gather = float(gather)
        if not 0.0 <= gather <= 60.0:
            raise ValueError(f"gather must be in [0, 60] seconds, got {gather!r}")
        gather_max = max(0.5, gather) if gather_max is None else float(gather_max)
        if not gather <= gather_max <= 600.0:
            raise ValueError(f"gather_max must be in [gather, 600] seconds (gather is {gather!r}), "
                             f"got {gather_max!r}")
        self.gather, self.gather_max = gather, gather_max
        if accounting not in self.ACCOUNTING:
            raise ValueError(f"accounting must be one of {', '.join(self.ACCOUNTING)}, got {accounting!r}")
        forget_after = float(forget_after)
        if not forget_after > 0.0:
            raise ValueError(f"forget_after must be > 0, got {forget_after!r}")
        rejoin_grace = float(rejoin_grace)
        if not 0.0 <= rejoin_grace <= forget_after:       # also rejects NaN
            raise ValueError(f"rejoin_grace must be in [0, forget_after], got {rejoin_grace!r}")
        self.rejoin_grace = rejoin_grace
        self.kill_grace = kill_grace
        self.accounting = accounting
        self.forget_after = forget_after
        self._vtime = 0.0                         # accounting="virtual" state
        self._offset: dict[str, float] = {}       # user -> allocated - effective
        self._last_seen: dict[str, float] = {}

    def __repr__(self) -> str:
        return (f"EthicPolicy(kill_grace={self.kill_grace!r}, accounting={self.accounting!r}"
                + (f", gather={self.gather!r}" if self.gather else "") + ")")

    def settled(self, requests: Mapping[str, Request], running: Mapping[str, float]) -> bool:
        """With every slot running: can the order start or kill nothing? True when no mandatory
        request waits (only a waiting mandatory request outranks a running one, rules 1-2; a
        waiting optional one never does). Spares the sort of a SeD's whole queue at every
        optional arrival while it is busy (100 users keep ~100 requests in each queue).
        ``virtual`` accounting always orders: its evaluations also watch who is present."""
        if self.accounting != "cumulative":
            return False
        for rid, r in requests.items():
            if not r.optional and rid not in running:
                return False
        return True

    def front(self, requests: Iterable[Request], running: Mapping[str, float], now: float,
              k: int) -> list[Request] | None:
        """The first ``k`` requests of :meth:`order`, when ranks 0-1 alone fill
        them (running mandatory, then waiting mandatory out of grace, FCFS):
        every optional request ranks after those, so its key (the allocation,
        a random draw) is not needed. ``None`` otherwise (order the queue). The
        three SeDs of the scale experiment that get every user's mandatory calls
        sorted ~200 requests at every read; this looks at each once, with no
        key for the rest. Cumulative accounting only: ``virtual``'s evaluation
        also watches who is present (:meth:`effective_allocation`), so it orders."""
        if self.accounting != "cumulative" or k <= 0:
            return None
        top: list[tuple[int, float, int, Request]] = []
        for r in requests:
            if r.optional:
                continue
            if r.id in running:
                top.append((_RUNNING_MANDATORY, r.submitted, r.seq, r))
            elif not self._in_grace(r, now):
                top.append((_WAITING_MANDATORY, r.submitted, r.seq, r))
        if len(top) < k:
            return None
        return [t[3] for t in heapq.nsmallest(k, top, key=lambda t: t[:3])]

    def hold_until(self, requests: Sequence[Request], running: Mapping[str, float], now: float) -> float | None:
        """``gather``: while an idle SeD gathers a burst of optional requests,
        the time until which nothing starts (None: start as the order says)."""
        if self.gather <= 0.0 or running or not requests:
            return None
        first = last = requests[0].submitted
        for r in requests:
            if not r.optional:
                return None
            s = r.submitted
            if s < first:
                first = s
            elif s > last:
                last = s
        until = min(last + self.gather, first + self.gather_max)
        return until if now < until else None

    def effective_allocation(self, requests: Sequence[Request], allocated: Mapping[str, float],
                             now: float) -> Mapping[str, float]:
        """Rule 4's key per user: ``allocated`` itself (cumulative) or the
        virtual-time-adjusted allocation (virtual); updates the virtual state."""
        if self.accounting == "cumulative":
            return allocated
        present = {r.user for r in requests}
        eff: dict[str, float] = {}
        arriving = []
        for u in present:
            seen = self._last_seen.get(u)
            # absent from the queue for longer than rejoin_grace: arriving anew. A shorter
            # absence (its request ended and its next one, sent to the same SeD, is a round
            # trip behind) keeps its place: else the least served user, absent for a moment
            # after each of its requests, would be levelled up to the others at every return
            if u not in self._offset or seen is None or (seen < self._prev_eval
                                                         and now - seen > self.rejoin_grace):
                arriving.append(u)
            else:
                eff[u] = allocated.get(u, 0.0) - self._offset[u]
        # the virtual time *now* (users already present accumulated service
        # since the last evaluation), before the arriving users join
        if eff:
            self._vtime = max(self._vtime, min(eff.values()))
        for u in arriving:
            # (re)appearing: level with the least served present user, and no
            # credit for the time it was away
            alloc = allocated.get(u, 0.0)
            own = alloc - self._offset[u] if u in self._offset else float("-inf")
            self._offset[u] = alloc - max(own, self._vtime)
            eff[u] = alloc - self._offset[u]
        for u in present:
            self._last_seen[u] = now
        if len(self._last_seen) > 64 and now - min(self._last_seen.values()) > self.forget_after:
            for u in [u for u, t in self._last_seen.items() if now - t > self.forget_after]:
                del self._last_seen[u]
                self._offset.pop(u, None)
        self._prev_eval = now
        return eff

    _prev_eval: float = float("-inf")

    def _in_grace(self, req: Request, now: float) -> bool:
        return self.kill_grace > 0.0 and now - req.submitted < self.kill_grace

    def order(self, requests: Sequence[Request], running: Mapping[str, float],
              allocated: Mapping[str, float], now: float,
              rng: random.Random) -> list[Request]:
        allocated = self.effective_allocation(requests, allocated, now)
        keyed: list[tuple[tuple, Request]] = []
        for req in requests:
            is_running = req.id in running
            if not req.optional:
                if is_running:
                    rank = _RUNNING_MANDATORY
                elif self._in_grace(req, now):
                    rank = _WAITING_MANDATORY_IN_GRACE
                else:
                    rank = _WAITING_MANDATORY
                # rule 3: FCFS; seq is unique per SeD so rules 4-5 never apply
                key = (rank, req.submitted, req.seq, 0.0, 0.0)
            else:
                rank = _RUNNING_OPTIONAL if is_running else _WAITING_OPTIONAL
                # rule 4 then rule 5
                key = (rank, 0.0, 0, allocated.get(req.user, 0.0), rng.random())
            keyed.append((key, req))
        keyed.sort(key=lambda kr: kr[0])
        return [req for _, req in keyed]

    def next_wakeup(self, requests: Sequence[Request], running: Mapping[str, float],
                    now: float) -> float | None:
        """When the order may change without any event: the earliest time a
        waiting mandatory request leaves its grace period while an optional
        request is running, or the end of a ``gather`` hold. ``None`` if no
        such time (always with ``kill_grace == 0`` and ``gather == 0``). The
        runtime should re-evaluate the scheduler then.
        """
        held = self.hold_until(requests, running, now)
        if held is not None:
            return held
        if self.kill_grace <= 0.0:
            return None
        if not any(r.optional and r.id in running for r in requests):
            return None
        times = [r.submitted + self.kill_grace for r in requests
                 if not r.optional and r.id not in running and self._in_grace(r, now)]
        return min(times, default=None)
