"""Back-ends running calls on the SeD's own host: worker processes and inline."""
from __future__ import annotations

import asyncio
import inspect
import time
import traceback
from typing import Any, Callable, ClassVar

from ...core.estimation import scheduler_tags
from ..shm import ShmLimits
from ..workers import WorkerGone, WorkerPool
from . import BaseBackend, Outcome, register_backend


def queue_estimate(sed, replica, service, now: float, server_type: str) -> dict:
    """Host metrics plus the queue's tags (``tcomp``, ``eft`` by simulating the queue...)."""
    sch = replica.scheduler
    vec = dict(sed.host.tags)
    vec["server_type"] = server_type
    vec.update(scheduler_tags(scheduler=sch, service=service.name, predictor=replica.predictor, now=now,
                              last_solve=replica.last_solve))
    return vec


class ProcessBackend(BaseBackend):
    """Each call runs in a worker process (forked: services of the user's
    script are there). A crashing, exiting or hanging service never takes the
    SeD down; cancel and preemption kill the worker (SIGKILL) and a fresh one
    replaces it. Costs a pipe round trip per call; arrays from 1 MiB cross
    in shared-memory segments (``shm``: :class:`~gridrpc.sed.shm.ShmLimits`),
    written once each way (see :mod:`gridrpc.sed.workers`).
    The pool (``workers`` processes) is shared by the replicas of the process."""
    name: ClassVar[str] = "process"
    ack_delay = 0.02            # a call that starts at once and ends quickly: RESULT stands for ACCEPTED
    linger_answers = True       # a client with many calls here gets its answers in batches
    copy_args = False           # views on the frames: written once into a segment for the worker

    def __init__(self, workers: int = 2, shm: ShmLimits | None = None, prestart: int = 1,
                 keep_hot: bool = True) -> None:
        self.size = workers
        self.shm = shm
        self.prestart = prestart        # workers forked at start (the rest on demand, on the SeD's loop)
        self.keep_hot = keep_hot        # the next queued call waits in the worker's pipe (send_ahead)
        self.pool: WorkerPool | None = None

    def bind(self, sed) -> None:
        super().bind(sed)
        self.pool = WorkerPool(sed.functions, size=self.size, limits=self.shm, prestart=self.prestart)

    async def start(self) -> None:
        self.pool.start()

    def services_changed(self, name, fn) -> None:
        if self.pool.loop is not None:
            self.pool.services_changed()

    async def run(self, call) -> Outcome | None:
        try:
            result = await self.pool.run(call.id, call.service, call.args, call.kwargs)
        except WorkerGone as exc:
            return _gone(exc, call)
        return _outcome(*result, call)

    def start_now(self, call, done) -> bool:
        """An idle worker gets the call from the current loop callback (the
        one that ended the previous call, usually): no task, no wake-up."""
        def ended(result, exc):
            done(_gone(exc, call) if exc is not None else _outcome(*result, call))
        return self.pool.start_now(call.id, call.service, call.args, call.kwargs, ended)

    def send_ahead(self, call, after) -> bool:
        """The next call of an FCFS queue waits in the pipe of the worker
        running the current one: the worker starts it as soon as it has
        answered, without waiting for the SeD to read that answer and send
        the next (docs/performance.md, "A worker kept hot")."""
        return self.keep_hot and self.pool.send_ahead(call.id, call.service, call.args, call.kwargs, after.id)

    def kill(self, call) -> bool:
        return self.pool.kill(call.id)

    def statistics(self) -> dict:
        return {"workers": len(self.pool.workers), "sent_ahead": self.pool.sent_ahead,
                "shm": self.pool.statistics()}

    async def close(self) -> None:
        await self.pool.aclose()


class InlineBackend(BaseBackend):
    """Each call runs in the SeD: coroutine functions on its loop, others in
    a thread. The fastest (no process hop, arrays never copied to a worker)
    but without isolation: a crash or a hang is the SeD's, and cancelling
    cannot stop a thread (its answer is dropped)."""
    name: ClassVar[str] = "inline"
    ack_delay = 0.02
    linger_answers = True

    def __init__(self, workers: int = 0) -> None:     # workers: accepted for a uniform factory
        pass

    async def run(self, call) -> Outcome | None:
        ok, value = await run_inline(call.svc.fn, call.args, call.kwargs)
        return _outcome(ok, value, call)

    def statistics(self) -> dict:
        return {"workers": 0}


def _gone(exc: BaseException, call) -> Outcome | None:
    """How a run the pool ended with ``exc`` ends for the runtime (None: stopped, answered by Stop)."""
    if not isinstance(exc, WorkerGone):          # not the pool's: answered, as _execute answers a back-end bug
        return Outcome(ok=False, kind="internal", error=(type(exc).__name__, f"the worker pool failed on "
                                                        f"{call.service}: {exc}", ""))
    if exc.killed:
        return None                     # answered by the runtime (Stop)
    return Outcome(ok=False, kind="worker_died", error=(
        "WorkerDied", f"the worker process running {call.service} died (exit code "
        f"{exc.exitcode}); the SeD is still serving", ""))


def _outcome(ok: bool, value: Any, call) -> Outcome:
    if ok:
        return Outcome(ok=True, value=value, run_time=time.time() - call.started)
    return Outcome(ok=False, error=value)


async def run_inline(fn: Callable, args: list, kwargs: dict) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, (type, message, traceback))``."""
    try:
        if inspect.iscoroutinefunction(fn):
            return True, await fn(*args, **kwargs)
        value = await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))
        if inspect.isawaitable(value):
            value = await value
        return True, value
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001
        return False, (type(exc).__name__, str(exc), traceback.format_exc())


register_backend("process", ProcessBackend)
register_backend("inline", InlineBackend)
