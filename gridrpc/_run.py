"""Run a daemon (MA, LA, SeD) in the foreground until SIGINT/SIGTERM.
Signal handlers live here, at the top level only."""
from __future__ import annotations

import asyncio
import signal
import sys


def run_daemon(daemon, ready: "callable | None" = None) -> None:
    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await daemon.start()
        if ready:
            ready(daemon)
        closed = getattr(daemon, "closed", None)
        waiters = [asyncio.ensure_future(stop.wait())]
        if isinstance(closed, asyncio.Event):
            waiters.append(asyncio.ensure_future(closed.wait()))
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        await daemon.aclose()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)
