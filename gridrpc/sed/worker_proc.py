"""What runs inside a worker process (:mod:`gridrpc.sed.workers` forks it).

The loop of one worker: read a call from the pipe, run the service, send the
answer, and again. The SeD names a call to stop in two words of shared
memory: ``stop`` (the call to interrupt: SIGUSR1 raises
:class:`CallInterrupted` inside the service while that call runs) and
``skip`` (a call sent ahead and withdrawn before it began); the worker
checks both before each call, so a named call never starts.
"""
from __future__ import annotations

import asyncio
import gc
import inspect
import os
import pickle
import signal
import traceback
from typing import Callable

from .shm import OwnSegments, ShmError, ShmLimits
from .worker_link import Link


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the SeD dies (even by kill -9)."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)          # PR_SET_PDEATHSIG
        if os.getppid() == 1:                  # the SeD died before prctl took effect
            os._exit(0)
    except (OSError, AttributeError):
        pass


def _close_inherited_segments() -> None:
    """Close the SeD's segment descriptors that fork copied (the pool's and
    those CPython's mmap objects keep): a segment the SeD closes must not
    live on in a worker."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:gridrpc-"):
                os.close(int(name))
        except OSError:
            pass


class CallInterrupted(BaseException):
    """Raised inside a service whose call was cancelled or preempted (a
    BaseException, as KeyboardInterrupt: ``except Exception`` in a service
    does not swallow it)."""


def worker_main(conn, services: dict[str, Callable], inherited: list, limits: ShmLimits, stop=None,
                 skip=None) -> None:
    # the SeD's objects copied by fork are never collected here (some point
    # into its segments, which are not mapped in this process)
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    running = [0, 0]        # [number of the call being served (0 between calls), calls received]

    def interrupt(_signum, _frame):
        # only the call the SeD named, and only while it runs: a late signal
        # (the call ended meanwhile) is ignored; at most one raise per call
        if running[0] and stop is not None and (stop.value == running[0]
                                                or (skip is not None and skip.value == running[0])):
            running[0] = 0
            raise CallInterrupted()

    signal.signal(signal.SIGUSR1, interrupt)
    # the SeD forked us with SIGUSR1 blocked (WorkerPool._spawn): one sent before the line above
    # would have killed us (its default action); pending, it reaches the handler now and is
    # ignored there, and the shared word stops the call as it begins
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    # fork copied the SeD's ends of every worker pipe (ours included) and its
    # segments' descriptors: close them, so that EOF on our pipe really means
    # the SeD is gone and a segment the SeD closes is freed
    for other in inherited:
        try:
            other.close_fds() if isinstance(other, Link) else other.close()
        except OSError:
            pass
    _close_inherited_segments()
    _die_with_parent()
    link = Link(conn, OwnSegments(limits, "w"), limits)
    while True:
        try:
            box = [_serve_one(link, services, running, stop, skip)]
        except (EOFError, OSError, KeyboardInterrupt):
            os._exit(0)
        except ShmError:                       # the SeD would never send this: give up
            os._exit(1)
        call_id = box[0][0]
        try:
            # the reply is handed over (no reference left here): the argument
            # segments whose views it drops go back to the SeD with it
            link.send(box.pop(), detach=True)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # unpicklable result
            link.send((call_id, False, (type(exc).__name__, f"cannot return the result: {exc}",
                                        traceback.format_exc())))


def _serve_one(link: Link, services: dict[str, Callable], running: list, stop=None, skip=None) -> tuple:
    msg = None
    while msg is None:          # None: the SeD only released or closed segments
        msg = link.recv()
    call_id, service, args, kwargs = msg
    del msg
    running[1] += 1
    try:
        try:
            running[0] = running[1]
            if (stop is not None and stop.value == running[1]) or (skip is not None and skip.value == running[1]):
                # interrupted before it began (the signal came while the call was being read, and was
                # ignored then): the word the SeD wrote first says so
                running[0] = 0
                raise CallInterrupted()
            fn = services[service]
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
            running[0] = 0
            return (call_id, True, value)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
            running[0] = 0
            return (call_id, False, (type(exc).__name__, str(exc), traceback.format_exc()))
    except CallInterrupted:              # arrived while the service's own error was being formatted
        running[0] = 0
        return (call_id, False, ("CallInterrupted", "interrupted", ""))


async def _await(aw):
    return await aw
