"""Example services: ``add``, ``sleep``, ``echo``, ``fail``, ``dgemm``, ``exit``,
``montecarlo`` and a few more used by tests, demos and experiments.

Start them on a SeD with ``gridrpc sed --service gridrpc.examples.services:add``.
"""
from __future__ import annotations

import os
import time

import numpy as np

from gridrpc.files import File


def add(x: int, y: int) -> int:
    """Return x + y."""
    return x + y


def sleep(seconds: float) -> float:
    """Sleep ``seconds`` then return it (the task of the fairness experiments)."""
    time.sleep(seconds)
    return seconds


def echo(value):
    """Return the value unchanged (any supported type)."""
    return value


def fail(message: str = "failure requested"):
    """Raise RuntimeError(message)."""
    raise RuntimeError(message)


def dgemm(a, b, alpha: float = 1.0):
    """Return alpha * a @ b (numpy)."""
    return alpha * (np.asarray(a) @ np.asarray(b))


def exit(code: int = 1):  # noqa: A001 - the name is part of the API
    """The worker process running this call exits abruptly with ``code``."""
    os._exit(code)


def wc(path: File) -> dict:
    """Count lines, words and bytes of a file sent with the call (a
    ``gridrpc.File``; a path string is refused: it would name the server's files)."""
    with open(path, "rb") as fh:
        data = fh.read()
    return {"lines": data.count(b"\n"), "words": len(data.split()), "bytes": len(data)}


def noop():
    """Do nothing (benchmarks)."""
    return None


def montecarlo(seed: int, samples: int = 200_000) -> float:
    """Estimate pi from ``samples`` random points (numpy), reproducibly from ``seed``.

    The task of the README's optional computations: every seed is one
    independent estimate; average as many as the deadline allows."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    rng = np.random.default_rng(seed)
    inside, left = 0, samples
    while left:                                   # bounded memory for large sample counts
        n = min(left, 1 << 20)
        x, y = rng.random((2, n))
        inside += int(np.count_nonzero(x * x + y * y <= 1.0))
        left -= n
    return 4.0 * inside / samples


ALL = ["add", "sleep", "echo", "fail", "dgemm", "exit", "wc", "noop", "montecarlo"]


def upper_file(path: File):
    """Return a gridrpc.File holding the upper-cased content of the file sent
    with the call (a ``gridrpc.File``; the result is written beside the received
    copy, in the call's own directory)."""
    out = path + ".upper"
    with open(path, "rb") as src, open(out, "wb") as dst:
        dst.write(src.read().upper())
    return File(out)


ALL.append("upper_file")


# -- data pipelines (docs/data.md, benchmarks/data_pipeline.py): not in ALL ---------------------
def produce(n: int, value: float = 1.0):
    """A float64 array of ``n`` elements, all ``value``."""
    return np.full(int(n), float(value))


def transform(a, factor: float = 2.0):
    """``a * factor + 1`` (a new array)."""
    return np.asarray(a) * factor + 1.0


def reduce_sum(a) -> float:
    """The sum of ``a``."""
    return float(np.sum(a))


def combine(*parts) -> float:
    """Sum of numbers or arrays' sums (a DAG's join node)."""
    return float(sum(float(np.sum(p)) for p in parts))


DATA = ["produce", "transform", "reduce_sum", "combine"]
