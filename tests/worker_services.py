"""Services for the worker tests (tests/test_worker_*.py, tests/test_sed_ahead.py): a quick one, a slow
one, one that kills its worker, one that records what ran and in which order, and one that does not
stop when interrupted. ``BASE``: the first three by the names the tests call them."""
from __future__ import annotations

import os
import time


def add(a, b):
    return a + b


def nap(s: float) -> str:
    time.sleep(s)
    return "slept"


def exit_worker() -> None:
    os._exit(3)


BASE = {"add": add, "sleep": nap, "exit": exit_worker}


def mark(path: str, i: int, s: float) -> int:
    """Sleeps ``s``, then appends ``i`` to ``path``."""
    time.sleep(s)
    with open(path, "a") as fh:
        fh.write(f"{i}\n")
    return i


def ran(path: str) -> list[int]:
    """The ``i`` of every :func:`mark` that ran, in order."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [int(x) for x in fh.read().split()]


def stubborn(s: float) -> str:
    """Ignores interrupts for ``s`` seconds (as a service stuck in C code longer than the grace)."""
    end = time.monotonic() + s
    while time.monotonic() < end:
        try:
            time.sleep(0.01)
        except BaseException:  # noqa: BLE001
            pass
    return "done"
