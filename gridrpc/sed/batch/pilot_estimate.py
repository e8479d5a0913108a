"""The pilot part of the estimation vector, pure: the slots the pilots offer
(free at, end of their pilot) and the predicted start of each queued call on
them. :meth:`~.pilot_policy.PilotPool.estimate` uses both."""
from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from .pilot_config import PilotConfig
from .pilot_model import COMING, Pilot, PilotCall

__all__ = ["pilot_slots", "simulate_slots"]


def pilot_slots(pilots: Iterable[Pilot], calls: Mapping[str, PilotCall], config: PilotConfig, now: float, *,
                start_time: float, new_at: float | None) -> list[tuple[float, float]]:
    """``(free at, end of its pilot)`` for each slot of the ready pilots and
    of those on their way (``start_time``: the learnt start time), plus a new
    pilot's ready at ``new_at`` (None: none may be submitted)."""
    c = config
    slots: list[tuple[float, float]] = []
    for p in pilots:
        end = p.end(c.walltime)
        if p.state == "ready":
            running = sorted(calls[cid].dispatched + calls[cid].need for cid in p.calls if cid in calls)
            free = [now] * (c.cores - len(running)) + [max(now, t) for t in running]
            slots += [(t, end) for t in free]
        elif p.state in COMING and not p.doomed:
            ready_at = p.submitted + p.expected_wait + start_time
            slots += [(max(now, ready_at), (end if end is not None else ready_at + c.walltime))] * c.cores
    if new_at is not None:
        slots += [(new_at, new_at + c.walltime)] * c.cores
    return slots


def simulate_slots(slots: list[tuple[float, float]], queue: list[float], margin: float) -> list[float | None]:
    """Start time of each call of ``queue`` (needs, in order) on the earliest
    slot ``(free at, pilot end)`` where it ends ``margin`` before the pilot's
    end; None where no slot can hold it. A heap of slots: O(log n) per call
    while the earliest slots fit."""
    free = list(slots)
    heapq.heapify(free)
    starts: list[float | None] = []
    for need in queue:
        skipped = []
        while free and free[0][0] + need + margin > free[0][1]:
            skipped.append(heapq.heappop(free))       # too close to its pilot's end for this call
        if free:
            t, end = heapq.heappop(free)
            starts.append(t)
            heapq.heappush(free, (t + need, end))
        else:
            starts.append(None)
        for slot in skipped:
            heapq.heappush(free, slot)
    return starts
