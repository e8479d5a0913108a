"""Worker processes that run service calls.

A crashing, exiting or hanging service never takes the SeD down: each call
runs in a worker process (forked, so services defined in the user's script are
there). Cancelling or preempting a running call *interrupts* it: the SeD
names the call in a word of memory it shares with the worker and sends
SIGUSR1; the worker raises :class:`CallInterrupted` inside the service
(``time.sleep`` and any Python code stop at once), answers, and serves the
next call — no fork, no new process (a burst of preemptions used to cost a
fork of the whole SeD each, ~12 ms of its loop). A worker that has not
answered within ``interrupt_grace`` seconds (a service stuck in C code or
catching ``BaseException``) is killed for real (SIGKILL) and a fresh one
replaces it. Worker results come back through a pipe read by the event loop
(``add_reader``), so the SeD never blocks on them.

Arguments and results cross the pipe as plain pickle (protocol 5) — only
between the SeD and its own children, never on the network — with large
arrays in shared-memory segments (:mod:`gridrpc.sed.worker_link`,
:mod:`gridrpc.sed.shm`): an argument received from the network is written
once into a segment of the SeD and the service gets an array on it; a result
is written once into a segment of the worker (not at all when it is an
argument array returned) and the SeD sends it to the client from there.
(Not multiprocessing's ForkingPickler: it loses numpy's byte order, '>i4'
comes back as 'int32'.)

This module is the SeD's side (the pool); what runs inside a worker is
:mod:`gridrpc.sed.worker_proc`.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import multiprocessing as mp
import os
import signal
from dataclasses import dataclass, field
from typing import Any, Callable

from .shm import OwnSegments, ShmError, ShmLimits
from .worker_link import Link
from .worker_proc import CallInterrupted, worker_main  # noqa: F401 - CallInterrupted: re-exported

log = logging.getLogger(__name__)
_CTX = mp.get_context("fork")


@dataclass(eq=False, slots=True)
class _Job:
    """A call sent to a worker, until its answer is read (answers come back
    in the order the calls were sent)."""
    call_id: str
    serial: int                     # its number on the worker (what the stop word names)
    fut: Any = None                 # who waits (a future, a _Notify); None: sent ahead, not started yet
    dropped: bool = False           # given up (killed, or sent ahead and withdrawn): its answer is thrown away
    early: tuple | None = None      # sent ahead: its answer, read before the server started it


@dataclass(eq=False)
class _Worker:
    proc: Any
    link: Link
    generation: int
    stop: Any = None                # shared word: the number of the call to interrupt
    skip: Any = None                # another: the number of a call sent ahead and withdrawn (never to run)
    served: int = 0                 # calls sent to it (the worker counts the same)
    jobs: collections.deque = field(default_factory=collections.deque)   # _Job, oldest first
    interrupting: asyncio.TimerHandle | None = None   # a job was interrupted: its answer is awaited

    def job(self, call_id: str) -> "_Job | None":
        for j in self.jobs:
            if j.call_id == call_id:
                return j
        return None


class WorkerPool:
    """At most ``size`` workers, started on demand, shared by every SeD replica
    of the process. ``run`` waits for a free worker. ``limits``: the
    shared-memory segments (:class:`~gridrpc.sed.shm.ShmLimits`), applied to
    the SeD's and to each worker's."""

    def __init__(self, services: dict[str, Callable], size: int, prestart: int = 1,
                 limits: ShmLimits | None = None, interrupt_grace: float = 0.5) -> None:
        self.services = services
        self.interrupt_grace = interrupt_grace
        self.size = max(1, size)
        self.limits = limits or ShmLimits()
        self.segments = OwnSegments(self.limits, "s", notify=self._flush_soon)   # the arguments' segments
        self._flush_scheduled = False
        self.workers: list[_Worker] = []
        self.idle: collections.deque[_Worker] = collections.deque()
        self.waiters: collections.deque[asyncio.Future] = collections.deque()
        self.generation = 0
        self.by_call: dict[str, _Worker] = {}
        self.ahead: dict[str, _Job] = {}        # calls sent ahead whose answer came before their start
        self.sent_ahead = 0             # calls sent ahead (statistics)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.prestart = prestart
        self.spawned = 0
        self.interrupted = 0            # calls stopped by an interrupt (the worker kept)
        self.killed = 0                 # workers killed (interrupt not honoured in time, or close)
        self.died = 0                   # workers that exited on their own (crash, os._exit in a service)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        for _ in range(min(self.prestart, self.size)):
            self.idle.append(self._spawn())

    def services_changed(self) -> None:
        """New services: idle workers are replaced lazily by fresh forks."""
        self.generation += 1
        for w in list(self.idle):
            self._retire(w)
        self.idle.clear()
        # calls sent ahead went to workers forked with the old services: withdrawn, they are sent
        # again (to a fresh worker) when they start
        for call_id in [j.call_id for w in self.workers for j in w.jobs if j.fut is None and not j.dropped]:
            self.kill(call_id)
        for call_id in list(self.ahead):
            self.kill(call_id)

    def _spawn(self) -> _Worker:
        parent, child = _CTX.Pipe()
        inherited = [parent] + [w.link for w in self.workers]
        stop = _CTX.RawValue("q", 0)
        skip = _CTX.RawValue("q", 0)
        proc = _CTX.Process(target=worker_main, daemon=True,
                            args=(child, self.services, inherited, self.limits, stop, skip))
        # the child starts with SIGUSR1 blocked until it has its handler: an interrupt sent to a
        # worker forked for the call it carries (a cancel right after the submit) killed it
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        child.close()
        w = _Worker(proc=proc, link=Link(parent, self.segments, self.limits, notify=self._flush_soon),
                    generation=self.generation, stop=stop, skip=skip)
        self.workers.append(w)
        self.spawned += 1
        self.loop.add_reader(w.link.fileno(), self._readable, w)
        return w

    async def _acquire(self) -> _Worker:
        while True:
            w = self._idle_worker()
            if w is not None:
                return w
            if len(self.workers) < self.size:
                return self._spawn()
            fut = self.loop.create_future()
            self.waiters.append(fut)
            await fut

    def _release(self, w: _Worker) -> None:
        if w.jobs or w.interrupting is not None:
            return                      # still busy
        if w.generation != self.generation or self.closed:
            self._retire(w)
        else:
            self.idle.append(w)
            if w.link.pending():        # released while it ran a call: tell it now it is idle
                self._flush_soon()
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def start_now(self, call_id: str, service: str, args: list, kwargs: dict,
                  done: Callable[[tuple[bool, Any] | None, BaseException | None], None]) -> bool:
        """Hand the call to an idle worker now, without a task: ``done(result,
        None)`` or ``done(None, WorkerGone)`` is called from the loop callback
        that reads the worker's answer (or from :meth:`kill`). False, and
        nothing done, when no worker is idle (then :meth:`run` waits for one).
        When a call ends, its server starts the next from that same callback:
        the worker gets it without the loop iterations of a task's wake-ups."""
        note = _Notify(self, call_id, done)
        if self._start_ahead(call_id, note):
            return True
        w = self._idle_worker()
        if w is None:
            return False
        failed = self._hand(w, call_id, note, (call_id, service, args, kwargs))
        if failed is not None:               # the arguments could not be passed: nothing runs
            note.set_result((False, failed))
        return True

    # -- a worker kept hot: the next call in its pipe while it runs one ----------
    def send_ahead(self, call_id: str, service: str, args: list, kwargs: dict, after: str,
                   limit: int = 16384) -> bool:
        """Put ``call_id`` in the pipe of the worker running ``after`` (its
        only call), to run as soon as ``after`` ends, before the server has
        read that answer: the worker does not wait for the server between two
        calls. Only small calls (no out-of-band buffer, pickled under
        ``limit`` bytes: the pipe takes them without blocking). The server
        then starts it with :meth:`start_now` (nothing is sent again) or
        withdraws it with :meth:`kill`. False, and nothing sent, when that
        worker is not running ``after`` alone."""
        w = self.by_call.get(after)
        if (w is None or len(w.jobs) != 1 or w.jobs[0].call_id != after or w.jobs[0].fut is None
                or w.jobs[0].dropped or w.interrupting is not None or w.stop is None or w.skip is None
                or self.interrupt_grace <= 0 or w.generation != self.generation or self.closed
                or call_id in self.by_call):
            return False
        try:
            sent = w.link.send_small((call_id, service, args, kwargs), limit)
        except Exception:  # noqa: BLE001 - not sent ahead: it is sent when it starts, as any call
            return False
        if not sent:
            return False
        w.served += 1
        w.jobs.append(_Job(call_id, w.served))
        self.by_call[call_id] = w
        self.sent_ahead += 1
        return True

    def _start_ahead(self, call_id: str, note: "_Notify") -> bool:
        """The server starts a call it sent ahead: nothing to send."""
        early = self.ahead.pop(call_id, None)
        if early is not None:               # it already ran: its answer now, from the loop
            self.loop.call_soon(note.set_result, early.early)
            return True
        w = self.by_call.get(call_id)
        job = w.job(call_id) if w is not None else None
        if job is None or job.fut is not None or job.dropped:
            return False
        if w.jobs[0] is not job:
            # behind a call given up that has not answered yet (a cancel the SeD just made, its
            # interrupt maybe not honoured): withdrawn, it goes to another worker (if that worker
            # is then killed, a call that never began must not die with it)
            self.kill(call_id)
            return False
        job.fut = note
        return True

    def _idle_worker(self) -> _Worker | None:
        while self.idle:
            w = self.idle.popleft()
            # alive: what is_alive() asks (one waitpid), without its getpid() check: a syscall per call
            if w.generation == self.generation and w.proc.exitcode is None:
                return w
            self._retire(w)
        return None

    def _hand(self, w: _Worker, call_id: str, fut: Any, msg: tuple) -> tuple[str, str, str] | None:
        """Send the call to ``w``; the error when it cannot be sent (``w`` is released)."""
        self.by_call[call_id] = w
        w.served += 1
        job = _Job(call_id, w.served, fut)
        w.jobs.append(job)
        try:
            w.link.send(msg)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            self.by_call.pop(call_id, None)
            w.jobs.remove(job)
            w.served -= 1
            self._release(w)
            return (type(exc).__name__, f"cannot pass the arguments to the worker: {exc}", "")
        return None

    async def run(self, call_id: str, service: str, args: list, kwargs: dict) -> tuple[bool, Any]:
        """Returns (True, value) or (False, (type, message, traceback)).
        Raises WorkerGone if the worker died or was killed."""
        w = await self._acquire()
        fut = self.loop.create_future()
        failed = self._hand(w, call_id, fut, (call_id, service, args, kwargs))
        if failed is not None:
            return False, failed
        try:
            return await fut
        finally:
            self.by_call.pop(call_id, None)

    def _readable(self, w: _Worker) -> None:
        try:
            call_id, ok, value = w.link.recv()
        except (EOFError, OSError, ConnectionError):
            self._died(w)
            return
        except ShmError as exc:         # the pipe cannot be trusted any more: a fresh worker
            self._broken(w, f"bad answer from the worker: {exc}")
            return
        except Exception as exc:  # result could not be unpickled
            call_id, ok, value = None, False, (type(exc).__name__, str(exc), "")
        if not w.jobs or (call_id is not None and w.jobs[0].call_id != call_id):
            self._broken(w, f"answer for {call_id!r} out of turn")
            return
        job = w.jobs.popleft()
        if w.interrupting is not None:  # the call given up answered (or one before it: see below)
            w.interrupting.cancel()
            w.interrupting = None
        if w.jobs and w.jobs[0].dropped:
            # the worker now reaches a call withdrawn while it waited in the pipe: it stops it before
            # it begins (the word says so), and is given interrupt_grace from now, not from the withdrawal
            w.interrupting = self.loop.call_later(self.interrupt_grace, self._not_interrupted, w)
        fut = job.fut
        if job.dropped:
            fut = None
        elif fut is None:               # sent ahead and not started by the server yet: kept for then
            job.early = (ok, value)
            self.ahead[job.call_id] = job
        self._release(w)
        if fut is not None and not fut.done():
            fut.set_result((ok, value))

    def _end_jobs(self, w: _Worker, exitcode: int | None = None, killed: bool = False,
                  result: tuple | None = None) -> None:
        """Every call on ``w`` ends (it is gone): the started ones with
        ``result`` if given, else :class:`WorkerGone`; those sent ahead are
        forgotten (the server sends them again when it starts them)."""
        jobs, w.jobs = list(w.jobs), collections.deque()
        for j in jobs:
            if self.by_call.get(j.call_id) is w:
                del self.by_call[j.call_id]
            fut = None if j.dropped else j.fut
            if fut is not None and not fut.done():
                if result is not None:
                    fut.set_result(result)
                else:
                    fut.set_exception(WorkerGone(j.call_id, exitcode, killed))

    def _broken(self, w: _Worker, message: str) -> None:
        self._retire(w, kill=True)
        self._wake()
        self._end_jobs(w, result=(False, ("ShmError", message, "")))

    def _died(self, w: _Worker) -> None:
        self.died += 1
        self._retire(w)
        self._wake()
        self._end_jobs(w, w.proc.exitcode)

    def kill(self, call_id: str) -> bool:
        """Stop ``call_id`` now: its ``run`` raises WorkerGone at once; the
        worker is interrupted (SIGUSR1) and serves again when it has answered,
        or is killed after ``interrupt_grace`` seconds."""
        if self.ahead.pop(call_id, None) is not None:     # sent ahead, already answered: forgotten
            self.by_call.pop(call_id, None)
            return True
        w = self.by_call.pop(call_id, None)
        if w is None:
            return False
        job = w.job(call_id)
        if job is None:
            return False
        running = w.jobs[0] is job          # else it waits in the pipe behind the running call
        fut, job.fut, job.dropped = job.fut, None, True
        if fut is not None and not fut.done():
            fut.set_exception(WorkerGone(call_id, -signal.SIGUSR1, killed=True))
        if self.interrupt_grace <= 0 or w.stop is None:
            self._retire(w, kill=True)
            self._wake()
            self._end_jobs(w, -signal.SIGKILL)
            return True
        # the running call is named in ``stop``, one sent ahead in ``skip`` (at most one per worker):
        # withdrawing the one behind, then cancelling the running one, stops both
        if running or w.skip is None:
            w.stop.value = job.serial
        else:
            w.skip.value = job.serial
        try:
            os.kill(w.proc.pid, signal.SIGUSR1)     # ignored unless it is the call running
        except ProcessLookupError:      # already gone: its pipe's EOF retires it
            return True
        self.interrupted += 1
        if running and w.interrupting is None:  # (a call behind gets its grace when the worker reaches it)
            w.interrupting = self.loop.call_later(self.interrupt_grace, self._not_interrupted, w)
        return True

    def _not_interrupted(self, w: _Worker) -> None:
        w.interrupting = None
        if w in self.workers:
            log.warning("worker %s did not stop its call within %.1fs of an interrupt: killed",
                        w.proc.pid, self.interrupt_grace)
            self._retire(w, kill=True)
            self._wake()
            self._end_jobs(w, -signal.SIGKILL)      # a call started after the one given up

    def _retire(self, w: _Worker, kill: bool = False) -> None:
        if w.interrupting is not None:
            w.interrupting.cancel()
            w.interrupting = None
        if w in self.workers:
            self.workers.remove(w)
        try:
            self.loop.remove_reader(w.link.fileno())
        except (ValueError, OSError):
            pass
        if kill and w.proc.is_alive():
            w.proc.kill()
            self.killed += 1
        if not kill:
            w.link.close_fds()  # an idle worker exits on EOF
        w.proc.join(timeout=0.05 if not kill else 2)
        if w.proc.is_alive() and kill:
            log.warning("worker %s did not die after SIGKILL", w.proc.pid)
        # segments it was reading: reused if it is surely gone, else closed
        w.link.close(peer_dead=not w.proc.is_alive())
        self.segments.collect()

    def _flush_soon(self) -> None:
        """A view on a segment died (maybe in zmq's I/O thread) or a segment
        was closed: tell the idle workers soon, so that nothing stays mapped
        longer than needed."""
        if self._flush_scheduled or self.closed or self.loop is None:
            return
        self._flush_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:            # the loop is closed: nothing to tell any more
            pass

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed:
            return
        self.segments.collect()
        for w in self.idle:
            if w.link.pending():
                try:
                    w.link.send(None)
                except OSError:         # it died: its reader sees EOF
                    pass

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def statistics(self) -> dict:
        self.segments.collect()
        return self.segments.statistics()

    async def aclose(self) -> None:
        self.closed = True
        for w in list(self.workers):
            self._retire(w, kill=True)
            self._end_jobs(w, -signal.SIGKILL, killed=True)    # their callers learn
        for fut in self.waiters:
            if not fut.done():
                fut.cancel()
        self.segments.close()


class _Notify:
    """What :meth:`WorkerPool.start_now` waits on instead of a future: the
    few methods of one the pool uses, calling ``done`` once. A bug in
    ``done`` is logged, never raised into the pool's callbacks."""
    __slots__ = ("pool", "call_id", "fn", "finished")

    def __init__(self, pool: WorkerPool, call_id: str, fn: Callable) -> None:
        self.pool, self.call_id, self.fn, self.finished = pool, call_id, fn, False

    def done(self) -> bool:
        return self.finished

    def set_result(self, value: tuple[bool, Any]) -> None:
        self._call(value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._call(None, exc)

    def _call(self, value, exc) -> None:
        if self.finished:
            return
        self.finished = True
        self.pool.by_call.pop(self.call_id, None)
        try:
            self.fn(value, exc)
        except Exception:  # noqa: BLE001 - the server's bug: the pool keeps serving
            log.exception("handling the end of call %s failed", self.call_id)


class WorkerGone(Exception):
    def __init__(self, call_id: str | None, exitcode: int | None, killed: bool = False) -> None:
        super().__init__(f"worker running {call_id} ended (exit code {exitcode})")
        self.call_id, self.exitcode, self.killed = call_id, exitcode, killed
