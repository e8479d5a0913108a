"""Processes on a virtual clock for :mod:`.sim_runtime`: each a FIFO of
jobs run one at a time, paying CPU as they go; messages between them take
one hop. A job runs *now* (inline) when its process is idle, so with zero
costs nothing is deferred and the order of events is that of a plain
zero-latency simulation."""
from __future__ import annotations

import collections
import heapq
import itertools
from typing import Any

__all__ = ["Proc", "ProcessClock", "split"]


class Proc:
    """A process: a FIFO of jobs, one at a time; ``busy_until`` is the
    cursor of the running job (or when the last one ended)."""
    __slots__ = ("name", "kind", "busy_until", "queue", "waking", "busy", "msgs")

    def __init__(self, name: str, kind: str) -> None:
        self.name, self.kind = name, kind
        self.busy_until = 0.0
        self.queue: collections.deque = collections.deque()
        self.waking = False
        self.busy = 0.0
        self.msgs = 0


def split(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


class ProcessClock:
    """The event heap and the process model; a subclass dispatches the
    heap's events (``job`` and ``wake`` are handled by :meth:`_job` and
    :meth:`_wake`)."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.heap: list = []
        self.seq = itertools.count()
        self.now = 0.0

    # -- the heap -----------------------------------------------------------------
    def _push(self, t: float, kind: str, *data: Any) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, data))

    # -- processes ---------------------------------------------------------------
    def _job(self, proc: Proc, fn, *args) -> None:
        """Run ``fn(*args)`` on ``proc``: now if it is idle, else after its queue."""
        if not proc.queue and proc.busy_until <= self.now:
            proc.busy_until = self.now
            self._job_begins(proc)
            fn(*args)
            self._job_ended(proc)
        else:
            proc.queue.append((fn, args))
            if not proc.waking:
                proc.waking = True
                self._push(max(proc.busy_until, self.now), "wake", proc)

    def _wake(self, proc: Proc) -> None:
        if proc.busy_until > self.now:
            self._push(proc.busy_until, "wake", proc)
            return
        proc.waking = False
        fn, args = proc.queue.popleft()
        proc.busy_until = self.now
        self._job_begins(proc)
        fn(*args)
        self._job_ended(proc)
        if proc.queue and not proc.waking:
            proc.waking = True
            self._push(max(proc.busy_until, self.now), "wake", proc)

    def _job_begins(self, proc: Proc) -> None:
        """Called before each job of ``proc`` runs (its queue holds the jobs after it)."""

    def _job_ended(self, proc: Proc) -> None:
        """Called after each job of ``proc`` ran."""

    def _charge(self, proc: Proc, cost: float, msgs: int = 1) -> None:
        proc.busy_until += cost
        proc.busy += cost
        proc.msgs += msgs

    def _send(self, proc: Proc, dst: Proc, fn, *args) -> None:
        """A message from the job running on ``proc`` to a job of ``dst``:
        it leaves at ``proc``'s cursor and takes one hop (inline when that is
        now: the zero-overhead path)."""
        t = proc.busy_until + self.latency
        if t <= self.now:
            self._job(dst, fn, *args)
        else:
            self._push(t, "job", dst, fn, args)
