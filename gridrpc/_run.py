"""Run a daemon (MA, LA, SeD) in the foreground until SIGINT/SIGTERM.
Signal handlers live here, at the top level only.

Once serving, one line says what runs where (``SeD solver-1 serving solve at
tcp://127.0.0.1:41234 under parent tcp://127.0.0.1:5555``, ``Master Agent MA
serving at tcp://127.0.0.1:5555; HTTP status at http://127.0.0.1:8080``) on
stderr. SIGTERM
stops the daemon cleanly and returns; SIGINT (Ctrl-C) stops it cleanly too,
then exits with status 130 like any interrupted Unix program, without a
traceback. A daemon that cannot start is closed again (sockets released)
before the error propagates.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

log = logging.getLogger(__name__)

INTERRUPTED = 130          # 128 + SIGINT


def describe(daemon) -> str:
    """One line: kind, name, services (SeD), address, parent (or HTTP URL for the MA)."""
    name = getattr(daemon, "name", "?")
    address = getattr(daemon, "address", None) or getattr(daemon, "bind_address", "?")
    parent = getattr(daemon, "parent", None)
    kind = getattr(daemon, "kind", None)
    services = getattr(daemon, "services", None)
    if kind is None and isinstance(services, dict):
        label = "SeD"
    else:
        label = {"ma": "Master Agent", "la": "Local Agent", "sed": "SeD"}.get(kind, type(daemon).__name__)
    what = f"{label} {name}"
    replicas = getattr(daemon, "replicas", None)
    if isinstance(replicas, dict) and len(replicas) > 1:
        names = list(replicas)
        what += f" ({len(names)} replicas {names[0]}..{names[-1]})"
    line = f"{what} serving"
    if isinstance(services, dict):
        names = sorted(services)
        shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        line += f" {shown or 'no service'}"
    line += f" at {address}"
    if parent:
        line += f" under parent {parent}"
    elif kind != "ma":
        line += " with no parent (clients reach it only by its address)"
    http = getattr(daemon, "http", None)
    if http is not None and getattr(http, "url", None):
        line += f"; HTTP status at {http.url}"
    return line


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


def run_daemon(daemon, ready: "callable | None" = None) -> None:
    """Serve until SIGTERM (returns) or SIGINT (exits 130 after a clean stop).
    Exceptions from ``daemon.start()`` propagate after ``aclose()``."""
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
        try:
            await daemon.start()
        except BaseException:
            try:
                await daemon.aclose()      # release what start() bound before failing
            except Exception:  # noqa: BLE001 - the start error is the one to report
                log.debug("closing after a failed start", exc_info=True)
            raise
        try:
            settle_gc()
            _say(describe(daemon))
            if ready:
                ready(daemon)
            closed = getattr(daemon, "closed", None)
            waiters = [asyncio.ensure_future(stop.wait())]
            if isinstance(closed, asyncio.Event):
                waiters.append(asyncio.ensure_future(closed.wait()))
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
