"""What every daemon of the tree (Master Agent, Local Agent, SeD and its
batch and cloud variants) shares: starting, stopping, leaving when its
parent is gone, and saying what it serves.

A :class:`Daemon` goes through ``new -> started -> closing -> closed``, in
the manner of aiohttp's ``BaseRunner``:

- :meth:`Daemon.start` runs the subclass's :meth:`~Daemon.setup`. Each step of
  ``setup`` that acquires something (a socket, a link, a task) pushes its undo
  on the daemon's cleanup stack (:meth:`~Daemon.on_cleanup`) as it acquires
  it (just before, where undoing a half-started one is safe); what
  ``__init__`` made is pushed there too. A ``setup`` that raises is closed
  again (what it bound is released) before the error propagates.
- :meth:`Daemon.aclose` marks the daemon ``closing`` (nothing new starts),
  runs :meth:`~Daemon.drain` (work in flight ends while the sockets are still
  open, so it can still be answered), then the cleanup stack in reverse
  order of pushing, on any exit (an undo that raises does not stop the
  others), and sets :attr:`~Daemon.closed`. It may be called any number of
  times and from several tasks: each call returns once the daemon is closed.
- :meth:`Daemon.orphaned` is the parent link's ``on_orphaned``: the parent has
  been gone longer than ``orphan_timeout``; the daemon closes itself once
  :meth:`~Daemon.may_leave` agrees (a SeD waits for its running calls).
- :meth:`Daemon.describe` is the one line a daemon prints once serving;
  :meth:`Daemon.ready_info` what ``--ready-file`` gets.

Signals and the process exit status are not handled here but by the
program that runs a daemon (:func:`gridrpc._run.run_daemon`).
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)

__all__ = ["Daemon"]


class Daemon:
    """Base of the tree's daemons: ``name`` in the tree, the ``address`` to
    bind (:attr:`address` is the bound one, once started), the ``parent``'s
    address (None: none) and the ``orphan_timeout`` (None: never leave).
    Subclasses implement :meth:`setup`; they may override :meth:`drain`,
    :meth:`may_leave`, :attr:`label`, :attr:`root` and the ``describe_*``
    pieces."""

    #: what the start-up line and the logs call this kind of daemon
    label = "daemon"
    #: the root of a tree has no parent by design (the start-up line does not remark on it)
    root = False

    def __init__(self, *, name: str, address: str, parent: str | None = None,
                 orphan_timeout: float | None = None) -> None:
        self.name = name
        self.bind_address = address
        self.address: str | None = None
        self.parent = parent
        self.orphan_timeout = orphan_timeout
        self.closed = asyncio.Event()          # set once aclose() has finished
        self.closing = False                   # aclose() began: nothing new starts
        self.orphan_exit = False               # closing because the parent stayed gone
        self._cleanup = contextlib.AsyncExitStack()
        self._orphan_task: asyncio.Task | None = None

    # -- start and stop -----------------------------------------------------------------
    async def setup(self) -> None:
        """Acquire what serving needs, pushing each undo with :meth:`on_cleanup`."""

    async def drain(self) -> None:
        """First step of :meth:`aclose`, before the cleanup stack: let the work
        in flight end while the sockets are still open."""

    def on_cleanup(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Run ``fn(*args, **kwargs)`` (a function or a coroutine function)
        when the daemon closes; the last pushed runs first."""
        if inspect.iscoroutinefunction(fn):
            self._cleanup.push_async_callback(fn, *args, **kwargs)
        else:
            self._cleanup.callback(fn, *args, **kwargs)

    async def start(self):
        """Run :meth:`setup`; on failure close again, then raise."""
        try:
            await self.setup()
        except BaseException:
            try:
                await self.aclose()      # release what setup() acquired before failing
            except Exception:  # noqa: BLE001 - the start error is the one to report
                log.debug("%s %s: closing after a failed start", self.label, self.name, exc_info=True)
            raise
        return self

    async def aclose(self) -> None:
        """Drain, then unwind the cleanup stack, then set :attr:`closed`."""
        if self.closing:
            await self.closed.wait()
            return
        self.closing = True
        try:
            try:
                await self.drain()
            finally:
                await self._cleanup.aclose()
        finally:
            self.closed.set()

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def run(self) -> None:
        """Serve in the foreground until SIGINT or SIGTERM (:func:`gridrpc._run.run_daemon`)."""
        from .._run import run_daemon
        run_daemon(self)

    # -- the parent gone ------------------------------------------------------------------
    def may_leave(self) -> bool:
        """Whether an orphaned daemon may exit now (asked at every heartbeat
        while the parent stays gone)."""
        return True

    def orphaned(self) -> None:
        """The parent link's ``on_orphaned``: close once :meth:`may_leave` agrees."""
        if self.orphan_exit or self.closing or not self.may_leave():
            return
        self.orphan_exit = True
        log.warning("%s %s: parent gone for more than %gs%s: exiting", self.label, self.name,
                    self.orphan_timeout or 0.0, self.orphan_detail())
        self._orphan_task = asyncio.get_running_loop().create_task(self.aclose())

    def orphan_detail(self) -> str:
        """Words added to the orphan exit's log line (why now)."""
        return ""

    # -- describing itself ----------------------------------------------------------------
    def describe_title(self) -> str:
        """What runs: the label and the name."""
        return f"{self.label} {self.name}"

    def describe_offer(self) -> str:
        """What it serves, after ``serving`` (a SeD's services)."""
        return ""

    def describe(self) -> str:
        """One line: what runs, what it serves, its address, its parent."""
        line = f"{self.describe_title()} serving{self.describe_offer()} at {self.address or self.bind_address}"
        if self.parent:
            line += f" under parent {self.parent}"
        elif not self.root:
            line += " with no parent (clients reach it only by its address)"
        return line

    def ready_info(self) -> dict:
        """What ``--ready-file`` holds once serving (the pid is the runner's to add)."""
        return {"name": self.name, "address": self.address}
