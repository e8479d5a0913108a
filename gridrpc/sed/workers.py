"""Worker processes that run service calls.

A crashing, exiting or hanging service never takes the SeD down: each call
runs in a worker process (forked, so services defined in the user's script are
there). Cancelling or preempting a running call kills its worker for real
(SIGKILL) and a fresh one replaces it. Worker results come back through a pipe
read by the event loop (``add_reader``), so the SeD never blocks on them.

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


def _worker_main(conn, services: dict[str, Callable], inherited: list) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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
        try:
            fn = services[service]
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
            reply = (call_id, True, value)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
            reply = (call_id, False, (type(exc).__name__, str(exc), traceback.format_exc()))
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
    call_id: str | None = None
    future: asyncio.Future | None = None
    segments: list = field(default_factory=list)   # shared memory sent to it, not yet taken


class WorkerPool:
    """At most ``size`` workers, started on demand, shared by every SeD replica
    of the process. ``run`` waits for a free worker."""

    def __init__(self, services: dict[str, Callable], size: int, prestart: int = 1) -> None:
        self.services = services
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
        proc = _CTX.Process(target=_worker_main, args=(child, self.services, inherited), daemon=True)
        proc.start()
        child.close()
        w = _Worker(proc=proc, conn=parent, generation=self.generation)
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
        """Stop the worker running ``call_id`` now. Its ``run`` raises WorkerGone."""
        w = self.by_call.get(call_id)
        if w is None:
            return False
        fut = w.future
        self._retire(w, kill=True)
        self._wake()
        if fut is not None and not fut.done():
            fut.set_exception(WorkerGone(call_id, -signal.SIGKILL, killed=True))
        return True

    def _retire(self, w: _Worker, kill: bool = False) -> None:
        if w.segments:
            if kill and w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=2)
            unlink_segments(w.segments)
            w.segments = []
        if w in self.workers:
            self.workers.remove(w)
        try:
            self.loop.remove_reader(w.conn.fileno())
        except (ValueError, OSError):
            pass
        if kill and w.proc.is_alive():
            w.proc.kill()
        w.conn.close()          # an idle worker exits on EOF
        w.proc.join(timeout=0.05 if not kill else 2)
        if w.proc.is_alive() and kill:
            log.warning("worker %s did not die after SIGKILL", w.proc.pid)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    async def aclose(self) -> None:
        self.closed = True
        for w in list(self.workers):
            self._retire(w, kill=True)
        for fut in self.waiters:
            if not fut.done():
                fut.cancel()


class WorkerGone(Exception):
    def __init__(self, call_id: str | None, exitcode: int | None, killed: bool = False) -> None:
        super().__init__(f"worker running {call_id} ended (exit code {exitcode})")
        self.call_id, self.exitcode, self.killed = call_id, exitcode, killed
