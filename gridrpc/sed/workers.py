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
catching ``BaseException``) is killed for real (SIGKILL), reaped without
blocking the loop, and a fresh one replaces it. Worker results come back
through a pipe read by the event loop (``add_reader``), so the SeD never
blocks on them.

Arguments and results cross the pipe with plain pickle (protocol 5) — only
between the SeD and its own children, never on the network. (Not
multiprocessing's ForkingPickler: it loses numpy's byte order, '>i4' comes
back as 'int32'.)
"""
from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import multiprocessing as mp

import numpy as np
from multiprocessing import shared_memory
import os
import pickle
import signal
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)
_CTX = mp.get_context("fork")


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


class CallInterrupted(BaseException):
    """Raised inside a service whose call was cancelled or preempted (a
    BaseException, as KeyboardInterrupt: ``except Exception`` in a service
    does not swallow it)."""


def _worker_main(conn, services: dict[str, Callable], inherited: list, stop=None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    running = [0]        # number of the call being served (the n-th this worker received); 0 between calls

    def interrupt(_signum, _frame):
        # only the call the SeD named, and only while it runs: a late signal
        # (the call ended meanwhile) is ignored; at most one raise per call
        if running[0] and stop is not None and stop.value == running[0]:
            running[0] = 0
            raise CallInterrupted()

    signal.signal(signal.SIGUSR1, interrupt)
    served = 0
    # fork copied the SeD's ends of every worker pipe (ours included): close
    # them, so that EOF on our pipe really means the SeD is gone
    for other in inherited:
        try:
            other.close()
        except OSError:
            pass
    _die_with_parent()
    while True:
        try:
            call_id, service, args, kwargs = recv_obj(conn)
        except (EOFError, OSError, KeyboardInterrupt):
            os._exit(0)
        served += 1
        try:
            try:
                running[0] = served
                fn = services[service]
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = asyncio.run(_await(value))
                running[0] = 0
                reply = (call_id, True, value)
            except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
                running[0] = 0
                reply = (call_id, False, (type(exc).__name__, str(exc), traceback.format_exc()))
        except CallInterrupted:          # arrived while the service's own error was being formatted
            running[0] = 0
            reply = (call_id, False, ("CallInterrupted", "interrupted", ""))
        try:
            send_obj(conn, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # unpicklable result
            send_obj(conn, (call_id, False, (type(exc).__name__, f"cannot return the result: {exc}",
                                             traceback.format_exc())))


SHM_THRESHOLD = 1 << 20      # buffers from 1 MiB go through shared memory, not the pipe


def send_obj(conn, obj) -> list[str]:
    """Pickle protocol 5 with out-of-band buffers: numpy arrays and bytes are
    not copied into the pickle. Buffers of 1 MiB and more travel through a
    shared-memory segment (one memcpy each side; a pipe moves < 1 GB/s),
    smaller ones through the pipe. The receiver unlinks the segments."""
    bufs: list = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    plan, segments = [], []
    try:
        for r in raws:
            if r.nbytes >= SHM_THRESHOLD:
                shm = shared_memory.SharedMemory(create=True, size=r.nbytes)
                _untrack(shm)
                segments.append(shm)
                np.frombuffer(shm.buf, np.uint8, r.nbytes)[:] = np.frombuffer(r, np.uint8)
                plan.append(("shm", shm.name, r.nbytes))
            else:
                plan.append(("pipe", None, r.nbytes))
        conn.send_bytes(pickle.dumps((head, plan), protocol=5))
        for r, (how, _, _) in zip(raws, plan):
            if how == "pipe":
                conn.send_bytes(r)
    except BaseException:
        for shm in segments:            # never leave segments behind on failure
            shm.close()
            shm.unlink()
        raise
    for shm in segments:
        shm.close()
    return [shm.name for shm in segments]


def unlink_segments(names: list[str]) -> None:
    """Remove segments a dead receiver never took (no leak in /dev/shm)."""
    for name in names:
        try:
            shm = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            continue
        _untrack(shm)
        shm.close()
        shm.unlink()


def recv_obj(conn):
    head, plan = pickle.loads(conn.recv_bytes())
    bufs = []
    for how, name, n in plan:
        if how == "shm":
            b = np.empty(n, np.uint8)  # writable: services may modify their arrays in place
            shm = shared_memory.SharedMemory(name=name)
            try:
                b[:] = np.frombuffer(shm.buf, np.uint8, n)
            finally:
                shm.close()
                shm.unlink()
            bufs.append(b)
            continue
        b = bytearray(n)
        if n:
            conn.recv_bytes_into(b)
        else:
            conn.recv_bytes()
        bufs.append(b)
    return pickle.loads(head, buffers=bufs)


def _untrack(shm) -> None:
    # the receiver unlinks the segment; without this the creator's resource
    # tracker would unlink it again at exit and warn about a "leak"
    try:
        from multiprocessing import resource_tracker
        resource_tracker.unregister(shm._name, "shared_memory")
    except Exception:  # noqa: BLE001
        pass


async def _await(aw):
    return await aw


@dataclass
class _Worker:
    proc: Any
    conn: Any
    generation: int
    stop: Any = None                # shared word: the number of the call to interrupt
    served: int = 0                 # calls sent to it (the worker counts the same)
    call_id: str | None = None
    future: asyncio.Future | None = None
    segments: list = field(default_factory=list)   # shared memory sent to it, not yet taken
    interrupting: asyncio.TimerHandle | None = None   # interrupted: its answer is awaited, then it is idle again


class WorkerPool:
    """At most ``size`` workers, started on demand, shared by every SeD replica
    of the process. ``run`` waits for a free worker."""

    def __init__(self, services: dict[str, Callable], size: int, prestart: int = 1,
                 interrupt_grace: float = 0.5) -> None:
        self.services = services
        self.interrupt_grace = interrupt_grace
        self.size = max(1, size)
        self.workers: list[_Worker] = []
        self.idle: collections.deque[_Worker] = collections.deque()
        self.waiters: collections.deque[asyncio.Future] = collections.deque()
        self.generation = 0
        self.by_call: dict[str, _Worker] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.prestart = prestart
        self.spawned = 0
        self.interrupted = 0            # calls stopped by an interrupt (the worker kept)
        self.killed = 0                 # workers killed (interrupt not honoured in time, or close)

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

    def _spawn(self) -> _Worker:
        parent, child = _CTX.Pipe()
        inherited = [parent] + [w.conn for w in self.workers]
        stop = _CTX.RawValue("q", 0)
        proc = _CTX.Process(target=_worker_main, args=(child, self.services, inherited, stop), daemon=True)
        proc.start()
        child.close()
        w = _Worker(proc=proc, conn=parent, generation=self.generation, stop=stop)
        self.workers.append(w)
        self.spawned += 1
        self.loop.add_reader(parent.fileno(), self._readable, w)
        return w

    async def _acquire(self) -> _Worker:
        while True:
            while self.idle:
                w = self.idle.popleft()
                if w.generation == self.generation and w.proc.is_alive():
                    return w
                self._retire(w)
            if len(self.workers) < self.size:
                return self._spawn()
            fut = self.loop.create_future()
            self.waiters.append(fut)
            await fut

    def _release(self, w: _Worker) -> None:
        w.segments = []                 # the worker answered: it took (and unlinked) them
        w.call_id = None
        w.future = None
        if w.generation != self.generation or self.closed:
            self._retire(w)
        else:
            self.idle.append(w)
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def run(self, call_id: str, service: str, args: list, kwargs: dict) -> tuple[bool, Any]:
        """Returns (True, value) or (False, (type, message, traceback)).
        Raises WorkerGone if the worker died or was killed."""
        w = await self._acquire()
        fut = self.loop.create_future()
        w.call_id, w.future = call_id, fut
        self.by_call[call_id] = w
        w.served += 1
        try:
            w.segments = send_obj(w.conn, (call_id, service, args, kwargs))
        except Exception as exc:
            self.by_call.pop(call_id, None)
            self._release(w)
            return False, (type(exc).__name__, f"cannot pass the arguments to the worker: {exc}", "")
        try:
            return await fut
        finally:
            self.by_call.pop(call_id, None)

    def _readable(self, w: _Worker) -> None:
        try:
            _call_id, ok, value = recv_obj(w.conn)
        except (EOFError, OSError, ConnectionError):
            self._died(w)
            return
        except Exception as exc:  # result could not be unpickled
            ok, value = False, (type(exc).__name__, str(exc), "")
        if w.interrupting is not None:  # the answer of a call already given up: the worker is free again
            w.interrupting.cancel()
            w.interrupting = None
        fut = w.future
        self._release(w)
        if fut is not None and not fut.done():
            fut.set_result((ok, value))

    def _died(self, w: _Worker) -> None:
        fut, call_id = w.future, w.call_id
        self._retire(w)
        code = w.proc.exitcode
        self._wake()
        if fut is not None and not fut.done():
            fut.set_exception(WorkerGone(call_id, code))

    def kill(self, call_id: str) -> bool:
        """Stop ``call_id`` now: its ``run`` raises WorkerGone at once; the
        worker is interrupted (SIGUSR1) and serves again when it has answered,
        or is killed after ``interrupt_grace`` seconds."""
        w = self.by_call.pop(call_id, None)
        if w is None:
            return False
        fut = w.future
        w.future, w.call_id = None, None
        if fut is not None and not fut.done():
            fut.set_exception(WorkerGone(call_id, -signal.SIGUSR1, killed=True))
        if self.interrupt_grace <= 0 or w.stop is None:
            self._retire(w, kill=True)
            self._wake()
            return True
        w.stop.value = w.served
        try:
            os.kill(w.proc.pid, signal.SIGUSR1)
        except ProcessLookupError:      # already gone: its pipe's EOF retires it
            return True
        self.interrupted += 1
        w.interrupting = self.loop.call_later(self.interrupt_grace, self._not_interrupted, w)
        return True

    def _not_interrupted(self, w: _Worker) -> None:
        w.interrupting = None
        if w in self.workers:
            log.warning("worker %s did not stop its call within %.1fs of an interrupt: killed",
                        w.proc.pid, self.interrupt_grace)
            self._retire(w, kill=True)
            self._wake()

    def _retire(self, w: _Worker, kill: bool = False) -> None:
        if w.interrupting is not None:
            w.interrupting.cancel()
            w.interrupting = None
        if kill and w.proc.is_alive():
            w.proc.kill()
            self.killed += 1
        if w.segments:
            if kill:
                w.proc.join(timeout=2)  # dead before its segments go (it may be reading one)
            unlink_segments(w.segments)
            w.segments = []
        if w in self.workers:
            self.workers.remove(w)
        try:
            self.loop.remove_reader(w.conn.fileno())
        except (ValueError, OSError):
            pass
        w.conn.close()          # an idle worker exits on EOF
        self._reap(w, 0)

    def _reap(self, w: _Worker, tries: int) -> None:
        """Collect the exit of a retired worker without blocking the loop."""
        if not w.proc.is_alive():       # waitpid(WNOHANG)
            return
        if tries >= 200 or self.loop is None or self.loop.is_closed():
            w.proc.join(timeout=0.5)
            if w.proc.is_alive():
                log.warning("worker %s did not exit", w.proc.pid)
            return
        self.loop.call_later(0.01, self._reap, w, tries + 1)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    async def aclose(self) -> None:
        self.closed = True
        workers = list(self.workers)
        for w in workers:
            fut = w.future
            self._retire(w, kill=True)
            if fut is not None and not fut.done():      # its caller learns the call is over
                fut.set_exception(WorkerGone(w.call_id, -signal.SIGKILL, killed=True))
        for w in workers:                   # shutting down: wait for them (no zombie left)
            w.proc.join(timeout=2)
        for fut in self.waiters:
            if not fut.done():
                fut.cancel()


class WorkerGone(Exception):
    def __init__(self, call_id: str | None, exitcode: int | None, killed: bool = False) -> None:
        super().__init__(f"worker running {call_id} ended (exit code {exitcode})")
        self.call_id, self.exitcode, self.killed = call_id, exitcode, killed
