"""The clock of the SimGrid engine (:mod:`gridrpc.sim.simgrid_engine`):
:class:`SgClock` is ``world.sim`` on SimGrid (``now`` is SimGrid's clock;
``at``/``after`` timers in a heap run by one timer actor, in time order,
ties in scheduling order), and runs SimGrid to an end (``run``). It also
guards every actor's body (an exception is kept and raised by ``run``) and
wakes actors from outside SimGrid's run.
"""
from __future__ import annotations

import heapq
import math
import random
import traceback
from typing import Any, Callable

__all__ = ["SgClock", "IDLE_WAIT", "EPSILON"]

#: how long the timer actor waits when no timer is due (a timed wait, not a blocked one: SimGrid
#: would call a run in which every actor waits forever a deadlock)
IDLE_WAIT = 1e7
#: timers due within this of the clock run now (SimGrid's clock after a timed wait is the sum of floats)
EPSILON = 1e-12


class SgClock:
    """``world.sim`` on SimGrid: ``now`` (SimGrid's clock), ``at``/``after``
    (timers, in a heap run by one actor in time order, ties in scheduling
    order), ``rng``, ``events`` and ``run(until, stop)``."""

    #: simulated seconds between two looks at ``run``'s ``stop`` predicate
    STOP_STEP = 0.01

    def __init__(self, sg, engine, seed: int, timer_host) -> None:
        self.sg = sg
        self.engine = engine
        self._engine_cls = sg.Engine
        self.rng = random.Random(seed)
        self.events = 0
        self.inside = False                 # SimGrid is running: the code that runs is an actor's
        self.timer_host = timer_host
        self._timers: list = []
        self._seq = 0
        self._sem = sg.Semaphore(0)
        self._waiting_until: float | None = None
        self.error: str | None = None       # the first exception raised in an actor (raised again by run)
        sg.Actor.create("timers", timer_host, self.guard, self._timer_loop)

    @property
    def now(self) -> float:
        return self._engine_cls.clock

    def at(self, t: float, fn: Callable, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (t, self._seq, fn, args))
        w = self._waiting_until
        if w is not None and t < w:
            self._waiting_until = None      # one wake-up is enough
            self.wake(self._sem)

    def after(self, dt: float, fn: Callable, *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def wake(self, sem) -> None:
        """Release ``sem``: from an actor directly; from outside SimGrid's run
        (between two ``run`` calls) by a one-shot actor, since only actors
        may act on SimGrid's objects."""
        if self.inside:
            sem.release()
        else:
            self.sg.Actor.create("wake", self.timer_host, self.guard, sem.release)

    def guard(self, fn: Callable, *args: Any) -> None:
        """An actor's body: ``fn(*args)``; an exception ends the actor and is
        kept for :meth:`run` to raise (SimGrid would abort the whole process)."""
        try:
            fn(*args)
        except Exception:           # noqa: BLE001 - reported by run()
            if self.error is None:
                self.error = traceback.format_exc()

    def _timer_loop(self) -> None:
        heap, sem, clock_cls = self._timers, self._sem, self._engine_cls
        pop = heapq.heappop
        while True:
            now = clock_cls.clock
            while heap and heap[0][0] <= now + EPSILON:
                _, _, fn, args = pop(heap)
                self.events += 1
                fn(*args)
                now = clock_cls.clock
            wait = heap[0][0] - now if heap else IDLE_WAIT
            self._waiting_until = now + wait
            sem.acquire_timeout(max(wait, 0.0))
            self._waiting_until = None

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None,
            max_events: int | None = None) -> None:
        """Run SimGrid to ``until`` (simulated seconds), or until ``stop()``
        holds (looked at every :attr:`STOP_STEP`) or ``max_events`` timers ran."""
        limit = until if until is not None else math.inf
        if not math.isfinite(limit) and stop is None and max_events is None:
            raise ValueError("a SimGrid run needs an end: until, stop or max_events (its timers never run out)")
        start_events = self.events
        self.inside = True
        try:
            if stop is None and max_events is None:
                self.engine.run_until(limit)
                return
            while self.now < limit:
                self.engine.run_until(min(limit, self.now + self.STOP_STEP))
                if stop is not None and stop():
                    break
                if max_events is not None and self.events - start_events >= max_events:
                    break
        finally:
            self.inside = False
            if self.error is not None:
                raise RuntimeError(f"an actor of the SimGrid run failed:\n{self.error}")
