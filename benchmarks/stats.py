"""Timing helpers: latency summaries, repeated rates."""
from __future__ import annotations

import statistics
import time


def latency(samples_s: list[float]) -> dict:
    """Median, p99, mean, min of round-trip times given in seconds -> ms."""
    xs = sorted(samples_s)
    n = len(xs)
    p99 = xs[min(n - 1, max(0, int(round(0.99 * (n - 1)))))]
    return {"median_ms": statistics.median(xs) * 1e3, "p99_ms": p99 * 1e3,
            "mean_ms": statistics.fmean(xs) * 1e3, "min_ms": xs[0] * 1e3, "n": n}


def rates(values: list[float]) -> dict:
    """Median of repeated rates, with all values kept."""
    return {"median": statistics.median(values), "all": values}


class Clock:
    __slots__ = ("t0",)

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.elapsed = time.perf_counter() - self.t0
