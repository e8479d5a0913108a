"""Counts per key that keep only what is counted (pure)."""
from __future__ import annotations

from typing import Hashable

__all__ = ["tally"]


def tally(counts: dict, key: Hashable, step: int) -> None:
    """Add ``step`` to ``counts[key]``; a count that falls to 0 leaves the
    dict, so it holds only the keys with something counted (calls in flight
    per server, per client, per user)."""
    n = counts.get(key, 0) + step
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)
