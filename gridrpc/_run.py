"""Run a daemon (MA, LA, SeD: a :class:`gridrpc.runtime.lifecycle.Daemon`)
in the foreground until SIGINT/SIGTERM. Signal handlers live here, at the
top level only.

Once serving, one line (the daemon's :meth:`~gridrpc.runtime.lifecycle.Daemon.describe`)
says what runs where (``SeD solver-1 serving solve at
tcp://127.0.0.1:41234 under parent tcp://127.0.0.1:5555``, ``Master Agent MA
serving at tcp://127.0.0.1:5555; HTTP status at http://127.0.0.1:8080``) on
stderr. SIGTERM
stops the daemon cleanly and returns; SIGINT (Ctrl-C) stops it cleanly too,
then exits with status 130 like any interrupted Unix program, without a
traceback. A daemon that cannot start is closed again (sockets released)
before the error propagates; one that closes itself (its parent gone past
``orphan_timeout``) ends the run.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .runtime.lifecycle import Daemon

log = logging.getLogger(__name__)

INTERRUPTED = 130          # 128 + SIGINT


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):   # stderr closed or a broken pipe: the daemon keeps serving
        pass


def settle_gc() -> None:
    """What start-up made (modules, the daemon's tables) lives as long as the process: take it out
    of the cyclic GC's walks. A SeD process holding 7,000 queued calls (the scale experiment) paused
    its loop 40-140 ms per full collection, and every call ending meanwhile waited: half of each
    pause was walking start-up objects (measured in one process: median 86 -> 38 ms). Worker
    processes forked later inherit it (their pages stay shared longer, too)."""
    gc.collect()
    gc.freeze()


#: descriptors a daemon asks for at start (within the hard limit)
WANTED_DESCRIPTORS = 65536


def raise_descriptor_limit(wanted: int = WANTED_DESCRIPTORS) -> int:
    """Raise the soft limit of open descriptors towards the hard one and
    return it. Every peer connection (idle or before authentication
    included) holds a descriptor; at a soft limit of 1,024 (a common
    default) 1,100 idle connections to an agent's port left libzmq unable to
    accept new clients, spinning on ``EMFILE``."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):      # not allowed here: keep what we have
            log.debug("cannot raise the descriptor limit to %d", target)
    return soft


def run_daemon(daemon: "Daemon", ready: "Callable[[Daemon], None] | None" = None) -> None:
    """Serve until SIGTERM (returns), SIGINT (exits 130 after a clean stop)
    or the daemon closes itself (returns). Exceptions from ``daemon.start()``
    propagate once it is closed again."""
    got: list[int] = []
    raise_descriptor_limit()

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: int) -> None:
            got.append(sig)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        await daemon.start()       # closes the daemon again if it fails
        try:
            settle_gc()
            _say(daemon.describe())
            if ready:
                ready(daemon)
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(daemon.closed.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
        finally:
            await daemon.aclose()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:   # Ctrl-C before the loop's handler was installed
        raise SystemExit(INTERRUPTED) from None
    if got and got[0] == signal.SIGINT:
        raise SystemExit(INTERRUPTED)
