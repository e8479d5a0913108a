"""One SimGrid engine per process: :func:`run_isolated` runs a function
(a SimGrid simulation) in a forked child process and returns its result, so
one program can run several SimGrid worlds (:mod:`gridrpc.sim.simgrid_engine`).
"""
from __future__ import annotations

import multiprocessing
import os
import traceback
from typing import Any, Callable

__all__ = ["run_isolated"]


def run_isolated(fn: Callable, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a forked child process (one SimGrid engine
    per process), its result sent back pickled; an exception in the child is
    raised here as a RuntimeError with the child's traceback."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise TimeoutError(f"SimGrid run of {getattr(fn, '__name__', fn)} took over {timeout} s")
        ok, value = parent.recv()
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"SimGrid run of {getattr(fn, '__name__', fn)} died (exit code {proc.exitcode})") from None
    finally:
        parent.close()
        if proc.is_alive():
            proc.kill()
        proc.join(5)
    if not ok:
        raise RuntimeError(f"SimGrid run of {getattr(fn, '__name__', fn)} failed:\n{value}")
    return value


def _child(conn, fn, args, kwargs) -> None:
    try:
        result = (True, fn(*args, **kwargs))
    except BaseException:           # noqa: BLE001 - reported to the parent
        result = (False, traceback.format_exc())
    try:
        conn.send(result)
        conn.close()
    finally:
        os._exit(0)                 # SimGrid's threads are parked in the engine: no interpreter shutdown
