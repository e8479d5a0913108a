"""The batch SeD: each call becomes one job of a batch scheduler (Slurm).

To the tree it is one SeD (``server_type: batch``) offering services; it runs
none itself. Per call (see ``docs/batch.md``):

1. the call is accepted and queued like on any SeD (the queue only holds
   calls beyond ``max_jobs``); when it starts, its arguments are written to
   ``<shared_dir>/<SeD>/jobs/<call id>/`` (the codec's JSON + raw buffers,
   :mod:`.jobfiles`) and a job script running ``<remote_python> -m
   gridrpc.sed.batch.run_job <dir>`` is submitted through the backend, in a
   thread (``sbatch`` blocks);
2. one background task polls *all* jobs with one ``backend.states()`` per
   ``poll_interval``; when a job is final the result (or the service's
   exception) is read back from the directory and sent to the client, and a
   job that ended without one (time limit, node failure, preemption, out of
   memory, cancelled by someone else, failure) becomes a RemoteError naming
   the job id, the scheduler's state, reason and exit code, with the tail of
   the job's output;
3. cancelling a call cancels its job (``backend.cancel`` checks it is gone)
   and then removes the directory.

Restarts: ``meta.json`` in each call directory is the SeD's state. A SeD
started with the same name and shared directory picks the jobs up again: it
polls them, keeps each outcome until the client asks (its ping, or the same
CALL again, gets the answer), and re-submits calls whose job was never
submitted. ACCEPTED carries ``patience`` (``restart_grace``): clients wait that
long for a silent batch SeD before failing the call over.

Estimation (:mod:`.estimate`): a background task refreshes a snapshot of the
cluster (``sinfo``, pending queue, ``sbatch --test-only`` for the default job
shape) every ``estimate_interval``; discovery never waits on the scheduler.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import importlib
import logging
import os
import shutil
import sys
import time
import uuid
from typing import Any

from ...core import messages as m
from ...core.messages import MsgType
from ...errors import ConfigError, GridRPCError, InvalidArgument, ProtocolError
from ..server import SeD, Replica, _Call
from ..services import Service
from . import jobfiles
from .base import BatchBackend, BatchError, BatchSubmitError, JobInfo, JobSpec, JobState
from .config import CALL_OPTION, BatchConfig, parse_call_request
from .estimate import ClusterSnapshot, JobHistory, RunRecord, batch_tags
from .state import StateDirMixin, _Job, _read_started, _runs_as_job  # noqa: F401

log = logging.getLogger(__name__)

__all__ = ["BatchSeD", "ERROR_TYPES"]

#: remote_type of the errors a batch call may end with (besides the service's own exceptions)
ERROR_TYPES = {
    JobState.FAILED: "BatchJobFailed",
    JobState.CANCELLED: "BatchJobCancelled",
    JobState.TIMEOUT: "BatchJobTimeout",
    JobState.NODE_FAIL: "BatchNodeFailure",
    JobState.PREEMPTED: "BatchJobPreempted",
    JobState.OUT_OF_MEMORY: "BatchOutOfMemory",
    JobState.UNKNOWN: "BatchJobLost",
}
_WHAT = {
    JobState.FAILED: "failed",
    JobState.CANCELLED: "was cancelled outside gridrpc",
    JobState.TIMEOUT: "reached its time limit and was killed",
    JobState.NODE_FAIL: "was lost to a node failure",
    JobState.PREEMPTED: "was preempted",
    JobState.OUT_OF_MEMORY: "ran out of memory and was killed",
    JobState.UNKNOWN: "vanished: the scheduler no longer knows it and it left no result",
}
_SWEEP_EVERY = 300.0


def importable_target(fn) -> str:
    """``module:qualname`` of a function the compute nodes can import;
    ConfigError for lambdas, nested functions and ``__main__`` functions."""
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not mod or not qual or "<" in qual or mod == "__main__":
        raise ConfigError(f"a batch service must be importable on the compute nodes: {fn!r} is "
                          f"{'in __main__' if mod == '__main__' else 'not a module-level function'}; "
                          "define it at module level of an importable module, or give 'module:function'")
    obj = sys.modules.get(mod) or importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    if obj is None:
        raise ConfigError(f"{mod}:{qual} cannot be found again by import; give 'module:function'")
    return f"{mod}:{qual}"


class BatchSeD(StateDirMixin, SeD):
    """A SeD whose calls run as batch jobs. ``backend`` defaults to
    ``make_backend(config.scheduler, **config.backend_options())``."""

    server_type = "batch"
    ack_delay = 0.0         # acknowledge at once: clients learn the patience/relay state
    result_grace = 5.0      # seconds a COMPLETED job's result file may take to appear (NFS caches)

    def __init__(self, name: str, parent: str | None = None, *, config: BatchConfig | None = None,
                 backend: BatchBackend | None = None, address: str = "tcp://127.0.0.1:0",
                 hb_interval: float = 1.0, hb_timeout: float = 3.0, orphan_timeout: float | None = None,
                 seed: int | None = None, max_message_size: int | None = None, queue: str = "fcfs",
                 queue_options: dict | None = None) -> None:
        config = config or BatchConfig()
        extra = {} if max_message_size is None else {"max_message_size": max_message_size}
        super().__init__(name, parent, address=address, max_concurrent=config.max_jobs, queue=queue,
                         replicas=1, workers=1, isolation="inline", hb_interval=hb_interval,
                         hb_timeout=hb_timeout, orphan_timeout=orphan_timeout, seed=seed,
                         queue_options=queue_options, **extra)
        if backend is None:
            from . import make_backend
            backend = make_backend(config.scheduler, **config.backend_options())
        self.config = config
        self.backend = backend
        self.state_dir = os.path.join(config.state_root, jobfiles.safe_name(name))
        self.jobs_dir = os.path.join(self.state_dir, "jobs")
        self.targets: dict[str, str] = {}          # service -> module:function run by the jobs
        self.history = JobHistory()
        self.records: list[dict] = []              # finished jobs: predicted vs actual (docs, tests)
        self.batch_stats = {"submitted": 0, "completed": 0, "failed": 0, "cancelled": 0,
                            "recovered": 0, "submit_errors": 0, "polls": 0, "poll_errors": 0}
        self._replica: Replica = next(iter(self.replicas.values()))
        self._jobs: dict[str, _Job] = {}           # call id -> job of a live call
        self._by_job: dict[str, _Job] = {}         # scheduler job id -> job being polled
        self._cancelling: dict[str, _Job] = {}     # call id -> job whose cancel is not verified yet
        self._undelivered: dict[str, _Job] = {}    # call id -> finished job nobody asked for yet
        self._snapshot: ClusterSnapshot | None = None
        self._submitted_since: list[tuple[float, int]] = []
        self._bg: set[asyncio.Task] = set()
        self._batch_closing = False
        self._last_sweep = 0.0
        self._poll_error_logged = 0.0
        self._cmd_pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix=f"{name}-batch-cmd")
        self._watch_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix=f"{name}-batch-poll")

    # ------------------------------------------------------------------ services
    def add_service(self, name: str, fn, *, estimate=None, doc: str | None = None,
                    aggregator: Any = None) -> None:
        """``fn`` is ``"module:function"`` (imported by the jobs; if it cannot be
        imported here it is still offered, without argument checks) or a
        module-level function."""
        if isinstance(fn, str):
            target = fn.split("=", 1)[-1]
            try:
                super().add_service(name, target, estimate=estimate, doc=doc, aggregator=aggregator)
            except ConfigError as exc:
                if ":" not in target:
                    raise
                log.info("batch SeD %s: %s is not importable here (%s); offered without argument "
                         "checks, the jobs import it", self.name, target, exc)
                self.services[name] = Service(name=name, fn=_runs_as_job, doc=doc or f"{target} (batch job)",
                                              estimate=estimate, aggregator=aggregator)
                self._fns[name] = _runs_as_job
                if self.pool.loop is not None:
                    self._announce()
        else:
            target = importable_target(fn)
            super().add_service(name, fn, estimate=estimate, doc=doc, aggregator=aggregator)
        self.targets[name] = target

    def remove_service(self, name: str) -> None:
        super().remove_service(name)
        self.targets.pop(name, None)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "BatchSeD":
        await asyncio.to_thread(os.makedirs, self.jobs_dir, exist_ok=True)
        await asyncio.to_thread(self._load_history)
        found = await asyncio.to_thread(self._scan)
        self._snapshot = await self._in(self._watch_pool, self._take_snapshot)
        await super().start()
        self._recover(found)         # no await since super().start(): no message handled before
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._poll_loop()))
        self._tasks.append(loop.create_task(self._estimate_loop()))
        log.info("batch SeD %s: scheduler %s, partition %s, shared directory %s, %d job(s) recovered",
                 self.name, self.config.scheduler, self.config.partition or "(default)", self.state_dir,
                 self.batch_stats["recovered"])
        return self

    async def aclose(self) -> None:
        if self._batch_closing or self._closing:
            return await super().aclose()
        self._batch_closing = True
        wait = self.config.command_timeout + 5
        submits = [j.submit_task for j in self._jobs.values() if j.submit_task and not j.submit_task.done()]
        if submits:    # let sbatch answer, so the job ids are recorded for a restart
            await asyncio.wait(submits, timeout=wait)
        if self.config.cancel_on_exit:
            for cid, call in list(self.calls.items()):
                job = self._jobs.get(cid)
                if job is not None:
                    job.cancel_requested = True
                    self._cancelling[cid] = job
                    self._start_cancel(job)
                self._finish_call(call, m.error_header(cid, "cancelled", f"batch SeD {self.name} stopped "
                                                       "(cancel_on_exit): job cancelled", **self._timing(call)))
        cancels = [j.cancel_task for j in self._cancelling.values() if j.cancel_task]
        if cancels:
            await asyncio.wait(cancels, timeout=self.config.cancel_timeout + wait)
        if self._bg:
            await asyncio.wait(list(self._bg), timeout=wait)
        await super().aclose()
        self._cmd_pool.shutdown(wait=False, cancel_futures=True)
        self._watch_pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _in(pool: concurrent.futures.ThreadPoolExecutor, fn, *args) -> asyncio.Future:
        """Run a blocking scheduler command in *pool*: submissions and cancels
        (``_cmd_pool``) never hold up the polls and snapshots (``_watch_pool``)."""
        return asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        return t

    # ------------------------------------------------------------------ calls
    def _call_workdir(self) -> str:
        # a fresh name per call, never derived from the request id (meta.json records the id)
        return os.path.join(self.jobs_dir, f"{time.time_ns():x}-{uuid.uuid4().hex[:8]}", "files")

    def _call_options(self, svc: Service, kwargs: dict) -> tuple[dict, dict]:
        if CALL_OPTION not in kwargs:
            return kwargs, {}
        kwargs = dict(kwargs)
        return kwargs, parse_call_request(kwargs.pop(CALL_OPTION), self.config)

    def _send(self, route: list, header: dict, buffers: list = ()) -> None:
        if header.get("type") == MsgType.ACCEPTED.value:
            header.setdefault("patience", self.config.restart_grace)
        super()._send(route, header, buffers)

    def _on_router(self, frames: list) -> None:
        if self._undelivered and len(frames) > 1:
            try:
                mt, h = m.parse_header(frames[1].bytes)
            except ProtocolError:
                mt = None
            if mt is MsgType.PING and isinstance(h.get("ids"), list):
                for cid in h["ids"]:
                    if isinstance(cid, str) and cid in self._undelivered:
                        self._deliver(frames[:1], cid)
            elif mt is MsgType.CALL and h["id"] in self._undelivered:
                self._deliver(frames[:1], h["id"])
                return
        super()._on_router(frames)

    def _new_job(self, call: _Call) -> _Job:
        c, o = self.config, call.options
        nodes = o.get("nodes", c.nodes) or 1
        tasks = o.get("ntasks", c.ntasks) or 1
        cpt = o.get("cpus_per_task", c.cpus_per_task) or 1
        job = _Job(call_id=call.id, dir=os.path.dirname(call.workdir),
                   service=call.service.name, user=call.user, received=call.received, options=dict(o),
                   walltime=o.get("walltime", c.time_limit), cpus=max(nodes, tasks * cpt))
        job.final = asyncio.get_running_loop().create_future()
        vec = self.estimate(call.replica, call.service, [], user=call.user)
        tcomp, source = self.history.predict(job.service, job.user, job.walltime)
        job.predicted = {"est_wait": vec.get("est_wait"), "est_wait_source": vec.get("est_wait_source"),
                         "est_wait_scheduler": vec.get("est_wait_scheduler"),
                         "tcomp": tcomp, "tcomp_source": source}
        self._jobs[call.id] = job
        return job

    def _job_name(self, service: str) -> str:
        return f"gridrpc-{self.name}-{service}"[:64]

    def _job_spec(self, call: _Call, job: _Job) -> JobSpec:
        c, o = self.config, call.options
        spec = JobSpec(
            script="#!/bin/sh\n", name=self._job_name(job.service), workdir=job.dir,
            partition=c.partition, account=c.account, time_limit=job.walltime,
            nodes=o.get("nodes", c.nodes), ntasks=o.get("ntasks", c.ntasks),
            cpus_per_task=o.get("cpus_per_task", c.cpus_per_task),
            output=os.path.join(job.dir, "job.out"), extra_options=c.sbatch_options,
            env={**c.job_env, "GRIDRPC_CALL_ID": call.id, "GRIDRPC_CALL_DIR": job.dir})
        command = [c.remote_python, "-m", "gridrpc.sed.batch.run_job", job.dir]
        render = getattr(self.backend, "render_script", None)
        if render is None:
            from .slurm import render_job_script as render
        return dataclasses.replace(spec, script=render(spec, command))

    async def _execute(self, call: _Call) -> None:      # Start action (replaces the worker pool)
        job = self._jobs.get(call.id) or self._new_job(call)
        try:
            if job.job_id is None and not await self._submit(call, job):
                return
            info = await job.final
            outcome, out_tail, began = await asyncio.to_thread(self._collect, job, info)
        except asyncio.CancelledError:
            return                    # killed (answered by the Kill action) or SeD closing
        if call.state == "killed" or call.id not in self.calls:
            return
        self._observe(job, info, outcome, began)
        header, buffers = self._reply(call, job, info, outcome, out_tail)
        self._done(call, header, buffers)

    async def _submit(self, call: _Call, job: _Job) -> bool:
        target = self.targets.get(job.service)
        try:
            if target is None:
                raise ConfigError(f"service {job.service!r} has no module:function for the jobs")
            if not job.written:
                await asyncio.to_thread(self._write_call, call, job, target)
            spec = self._job_spec(call, job)
        except (ConfigError, InvalidArgument, OSError, ValueError) as exc:
            self._fail(call, job, "BatchSubmitError", f"cannot prepare the job of call {call.id}: {exc}")
            return False
        job.state = "submitting"
        job.submitted = time.time()
        self._save(job)
        try:
            with open(os.path.join(job.dir, "job.sh"), "w") as fh:     # for people reading the directory
                fh.write(spec.script)
        except OSError:
            pass
        snap = self._snapshot
        check = bool(call.options) or (snap is not None and snap.impossible is not None)
        fut = asyncio.ensure_future(self._in(self._cmd_pool, self._checked_submit, spec, check))
        job.submit_task = fut
        fut.add_done_callback(lambda f, job=job: self._submitted(job, f))
        try:
            await asyncio.shield(fut)
        except BatchError as exc:
            self.batch_stats["submit_errors"] += 1
            self._fail(call, job, "BatchSubmitError", f"the {self.config.scheduler} scheduler refused "
                       f"the job of call {call.id}: {exc}")
            return False
        return True

    def _checked_submit(self, spec: JobSpec, check: bool) -> str:
        """(thread) Submit; a shape other than the default one is first tried
        with ``estimate_start`` (``sbatch --test-only``): Slurm accepts jobs
        no node can ever hold, and they would pend forever."""
        if check:
            try:
                self.backend.estimate_start(spec)
            except BatchSubmitError:
                raise
            except BatchError as exc:      # no estimate: not a refusal
                log.debug("estimate before submitting failed: %s", exc)
        return self.backend.submit(spec)

    def _write_call(self, call: _Call, job: _Job, target: str) -> None:
        os.makedirs(job.dir, exist_ok=True)
        jobfiles.write_call(job.dir, target=target, service=job.service, call_id=call.id,
                            args=call.args, kwargs=call.kwargs)
        job.written = True
        call.args, call.kwargs = [], {}      # on disk now: free the memory

    def _submitted(self, job: _Job, fut: asyncio.Future) -> None:
        job.submit_task = None
        if fut.cancelled() or fut.exception() is not None:
            job.state = "new"
            if job.cancel_requested:                   # nothing reached the scheduler
                self._cancelling.pop(job.call_id, None)
                self._remove_dir(job)
            return
        now = time.time()
        job.job_id, job.state = fut.result(), "submitted"
        job.submitted = job.submitted or now
        self._by_job[job.job_id] = job
        self._submitted_since.append((now, job.cpus))
        self.batch_stats["submitted"] += 1
        self._save(job)
        log.info("batch SeD %s: call %s (%s) is job %s", self.name, job.call_id, job.service, job.job_id)

    def _fail(self, call: _Call, job: _Job, type_: str, message: str) -> None:
        log.warning("batch SeD %s: %s", self.name, message)
        self.batch_stats["failed"] += 1
        self._done(call, m.error_header(call.id, "remote", message, type_=type_, **self._timing(call)))

    # ------------------------------------------------------------------ cancel
    def _kill_call(self, call: _Call) -> None:
        if call.task:
            call.task.cancel()          # it only waits; a submission in flight is shielded
        job = self._jobs.get(call.id)
        if job is not None:
            job.cancel_requested = True
            self._cancelling[call.id] = job
            self._start_cancel(job)

    def _start_cancel(self, job: _Job) -> None:
        if job.cancel_task is not None and not job.cancel_task.done():
            return
        job.state = "cancelling" if job.job_id or job.submit_task else job.state
        self._save(job)
        job.cancel_task = self._spawn(self._cancel_job(job))

    async def _cancel_job(self, job: _Job) -> None:
        if job.submit_task is not None:
            try:
                await asyncio.shield(job.submit_task)
            except Exception:  # noqa: BLE001 - refused: nothing to cancel
                pass
        if job.job_id is None:
            self._cancelling.pop(job.call_id, None)
            self._remove_dir(job)
            return
        try:
            info = await self._in(self._cmd_pool, functools.partial(
                self.backend.cancel, job.job_id, timeout=self.config.cancel_timeout))
        except BatchError as exc:
            log.error("batch SeD %s: cannot cancel job %s of call %s: %s (retried at the next poll)",
                      self.name, job.job_id, job.call_id, exc)
            job.cancel_task = None
            return
        log.info("batch SeD %s: job %s of call %s cancelled (%s)", self.name, job.job_id, job.call_id,
                 info.raw_state or info.state.value)
        self.batch_stats["cancelled"] += 1
        self._by_job.pop(job.job_id, None)
        self._cancelling.pop(job.call_id, None)
        self._remove_dir(job)

    # ------------------------------------------------------------------ polling
    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval)
            try:
                await self._poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep polling
                log.exception("batch SeD %s: poll failed", self.name)

    async def _poll_once(self) -> None:
        ids = list(self._by_job)
        if ids:
            self.batch_stats["polls"] += 1
            try:
                infos = await self._in(self._watch_pool, self.backend.states, ids)
            except BatchError as exc:
                self.batch_stats["poll_errors"] += 1
                if time.monotonic() - self._poll_error_logged > 60:
                    self._poll_error_logged = time.monotonic()
                    log.warning("batch SeD %s: cannot ask the scheduler about %d job(s): %s",
                                self.name, len(ids), exc)
                infos = {}
            now = time.time()
            for jid, info in infos.items():
                job = self._by_job.get(jid)
                if job is not None:
                    self._on_state(job, info, now)
        for job in list(self._cancelling.values()):
            if job.cancel_task is None:
                self._start_cancel(job)
        if time.monotonic() - self._last_sweep > _SWEEP_EVERY:
            self._last_sweep = time.monotonic()
            self._sweep()

    def _on_state(self, job: _Job, info: JobInfo, now: float) -> None:
        job.info = info
        if info.state is JobState.UNKNOWN:
            job.unknown_since = job.unknown_since or now
            left = os.path.exists(os.path.join(job.dir, "result.json")) or \
                os.path.exists(os.path.join(job.dir, "error.json"))
            if not left and now - job.unknown_since < self.config.lost_after:
                return
        else:
            job.unknown_since = None
        if info.start_time and job.started is None and (info.state is JobState.RUNNING or info.state.is_final):
            job.started = info.start_time
        if info.state is JobState.RUNNING and job.state != "running":
            job.started = job.started or now
            job.state = "running"
            call = self.calls.get(job.call_id)
            if call is not None:
                call.started = job.started
            if not job.cancel_requested:
                self._save(job)
        elif info.state.is_final or info.state is JobState.UNKNOWN:
            self._by_job.pop(job.job_id, None)
            job.ended = info.end_time or now
            if job.final is not None and not job.final.done():
                job.final.set_result(info)

    def _collect(self, job: _Job, info: JobInfo) -> tuple[jobfiles.Outcome | None, str, float | None]:
        """(thread) The job's result/error, the tail of its output if it has
        no result, and when it began (``started.json``); waits a little for a
        COMPLETED job's files (attribute caches of shared file systems)."""
        deadline = time.monotonic() + self.result_grace
        while True:
            try:
                outcome = jobfiles.read_outcome(job.dir)
            except (OSError, ValueError) as exc:
                outcome = jobfiles.Outcome(ok=False, type="BatchResultError",
                                           message=f"cannot read the result of job {job.job_id} in "
                                                   f"{job.dir}: {exc}")
            if outcome is not None or info.state is not JobState.COMPLETED or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        out_tail = "" if outcome is not None and outcome.ok else jobfiles.tail(os.path.join(job.dir, "job.out"))
        began = _read_started(job.dir).get("job_started")
        return outcome, out_tail, began if isinstance(began, (int, float)) else None

    def _reply(self, call: _Call, job: _Job, info: JobInfo, outcome: jobfiles.Outcome | None,
               out_tail: str) -> tuple[dict, list]:
        timing = self._timing(call)
        batch = {"job_id": job.job_id, "state": info.state.value, "raw_state": info.raw_state,
                 "reason": info.reason, "exit_code": info.exit_code, "signal": info.signal,
                 "nodes": list(info.node_list), "scheduler": self.config.scheduler}
        if outcome is not None and outcome.ok:
            self.batch_stats["completed"] += 1
            return m.make(MsgType.RESULT, call.id, value=outcome.value, batch=batch, **timing), \
                list(outcome.buffers)
        self.batch_stats["failed"] += 1
        if outcome is not None:      # the service raised (or could not start): its own error
            return m.error_header(call.id, "remote", outcome.message, type_=outcome.type,
                                  traceback=outcome.traceback, batch=batch, **timing), []
        type_ = ERROR_TYPES.get(info.state, "BatchJobFailed")
        what = _WHAT.get(info.state, f"ended in state {info.raw_state or info.state.value}")
        if info.state is JobState.COMPLETED:
            what = (f"completed but left no result in {job.dir} (is the shared directory visible "
                    f"from the compute nodes?)")
        detail = [f"{self.config.scheduler} state {info.raw_state or info.state.value}"]
        if info.reason:
            detail.append(f"reason {info.reason}")
        if info.exit_code is not None:
            detail.append(f"exit code {info.exit_code}:{info.signal or 0}")
        if info.state is JobState.TIMEOUT and job.walltime:
            detail.append(f"time limit {job.walltime:g}s")
        if info.node_list:
            detail.append(f"nodes {','.join(info.node_list)}")
        message = f"batch job {job.job_id} of {job.service} {what} ({'; '.join(detail)})"
        tb = f"output of job {job.job_id} ({job.dir}/job.out), last lines:\n{out_tail}" if out_tail else ""
        return m.error_header(call.id, "remote", message, type_=type_, traceback=tb, batch=batch, **timing), []

    def _observe(self, job: _Job, info: JobInfo, outcome: jobfiles.Outcome | None,
                 began: float | None) -> None:
        """Learn the run time; keep predicted vs actual for the accuracy table.
        Times written by the job itself (``started.json``, the result's end)
        are preferred to the scheduler's whole seconds."""
        start, end = info.start_time or job.started, info.end_time or job.ended
        if began is not None:
            start = began
        if outcome is not None and outcome.ended:
            end = outcome.ended
        if start is not None:
            job.started = start
        if end is not None:
            job.ended = end
        run = (end - start) if start is not None and end is not None else None
        wait = (start - job.submitted) if start is not None and job.submitted is not None else None
        ran = outcome is not None and outcome.type != "BatchSetupError"
        if run is not None and ran:
            self._append_history(RunRecord(service=job.service, user=job.user, run=max(0.0, run),
                                           wait=wait, walltime=job.walltime,
                                           nodes=job.options.get("nodes", self.config.nodes),
                                           time=end or time.time()))
        self.records.append({"call_id": job.call_id, "job_id": job.job_id, "service": job.service,
                             "user": job.user, "state": info.state.value, **{
                                 f"predicted_{k}": v for k, v in job.predicted.items()},
                             "actual_wait": wait, "actual_run": run})
        del self.records[:-1000]

    # ------------------------------------------------------------------ answers
    def _timing(self, call: _Call) -> dict:
        t = super()._timing(call)
        job = self._jobs.get(call.id)
        if job is not None:
            t["timing"].update(submitted=job.submitted, job_started=job.started, job_ended=job.ended,
                               job_id=job.job_id)
            if job.started:
                t["timing"]["started"] = job.started
        return t

    def _finish_call(self, call: _Call, header: dict, buffers: list = ()) -> None:
        if self.calls.pop(call.id, None) is None:
            return
        job = self._jobs.pop(call.id, None)
        frames = [m.dumps(header), *buffers]
        delivered = False
        if call.route and self.router is not None:
            try:
                self.router.send([*call.route, *frames])
                delivered = True
            except GridRPCError as exc:
                log.info("batch SeD %s: answer to %s not delivered (%s): kept until the client asks",
                         self.name, call.id, exc)
        self._remember(call.id, frames, buffers)
        if job is None:                      # never started (cancelled while queued, or rejected)
            if call.workdir:
                shutil.rmtree(os.path.dirname(call.workdir), ignore_errors=True)
            return
        if job.cancel_requested:
            return                           # the cancel removes the directory once the job is gone
        if delivered or header.get("error", {}).get("kind") == "cancelled":
            self._remove_dir(job)
        else:
            self._keep_reply(job, header, list(buffers))

    def _remember(self, cid: str, frames: list, buffers) -> None:
        self.recent[cid] = frames if sum(memoryview(b).nbytes for b in buffers) < 1 << 20 else frames[:1]
        while len(self.recent) > 512:
            self.recent.popitem(last=False)

    def _keep_reply(self, job: _Job, header: dict, buffers: list) -> None:
        """Nobody to answer now (the client will ask again): keep the answer on disk."""
        job.state = "done"
        job.reply = [m.dumps(header), *buffers]
        self._undelivered[job.call_id] = job
        try:
            jobfiles.write_reply(job.dir, header, buffers)
        except OSError as exc:
            log.error("batch SeD %s: cannot keep the answer of %s on disk: %s", self.name, job.call_id, exc)
        self._save(job)

    def _deliver(self, route: list, cid: str) -> None:
        job = self._undelivered[cid]
        frames = job.reply
        if frames is None:
            try:
                got = jobfiles.read_reply(job.dir)
            except (OSError, ValueError) as exc:
                log.error("batch SeD %s: cannot read the kept answer of %s: %s", self.name, cid, exc)
                got = None
            if got is None:
                return
            header, buffers = got
            frames = [m.dumps(header), *buffers]
        try:
            self.router.send([*route, *frames])
        except GridRPCError as exc:
            log.info("batch SeD %s: kept answer of %s not delivered: %s", self.name, cid, exc)
            return
        log.info("batch SeD %s: delivered the kept answer of %s (job %s)", self.name, cid, job.job_id)
        self._undelivered.pop(cid, None)
        self._remember(cid, frames, frames[1:])
        self._remove_dir(job)

    # ------------------------------------------------------------------ estimation
    def _on_parent(self, r: Replica, mt: MsgType, h: dict, frames: list) -> None:
        if mt is not MsgType.DISCOVER:
            return super()._on_parent(r, mt, h, frames)
        servers = []
        svc = self.services.get(h["service"])
        if svc is not None:
            user = h.get("user") if isinstance(h.get("user"), str) else None
            servers.append({"name": r.name, "address": self.address,
                            "estimation": self.estimate(r, svc, h.get("args") or [], user=user)})
        r.link.send(m.make(MsgType.SERVERS, h["id"], name=r.name, servers=servers))

    def estimate(self, r: Replica, svc: Service, args_light: list, user: str | None = None) -> dict:
        now = time.time()
        c = self.config
        tcomp, source = self.history.predict(svc.name, user, c.time_limit)
        snap = self._snapshot
        since = snap.taken if snap is not None else 0.0
        pending = [j for j in self._jobs.values() if j.state in ("submitting", "submitted", "new")]
        running = [j for j in self._jobs.values() if j.state == "running"]
        own_running = []
        for j in running:     # predicted ends; past due: another predicted run, within the limit
            run, _ = self.history.predict(j.service, j.user, j.walltime)
            end = (j.started or now) + run
            if end < now:
                end = now + run
                if j.walltime and j.started:
                    end = min(end, j.started + j.walltime)
            own_running.append((end, j.cpus))
        vec = batch_tags(
            now=now, snapshot=snap, tcomp=tcomp, tcomp_source=source,
            cpus_per_job=max(c.nodes or 1, (c.ntasks or 1) * (c.cpus_per_task or 1)),
            walltime=c.time_limit, num_pending=len(pending), num_running=len(running),
            own_running=own_running,
            own_pending_cpus=sum(j.cpus for j in pending if (j.submitted or now) < since),
            queued_here=len(r.scheduler.requests) - len(r.scheduler.running),
            submitted_cpus_since=sum(n for t, n in self._submitted_since if t >= since),
            max_jobs=c.max_jobs, last_solve=r.last_solve, scheduler=c.scheduler, partition=c.partition)
        if svc.estimate is not None:
            try:
                extra = svc.estimate(dict(vec), args_light)
                if isinstance(extra, dict):
                    vec.update(extra)
            except Exception:  # noqa: BLE001
                log.exception("estimation function of %s failed; standard tags only", svc.name)
        return vec

    def _default_spec(self) -> JobSpec:
        c = self.config
        return JobSpec(script="#!/bin/sh\ntrue\n", name=f"gridrpc-{self.name}-estimate",
                       partition=c.partition, account=c.account, time_limit=c.time_limit, nodes=c.nodes,
                       ntasks=c.ntasks, cpus_per_task=c.cpus_per_task, extra_options=c.sbatch_options)

    def _take_snapshot(self) -> ClusterSnapshot:
        """(thread) sinfo, the pending queue, and sbatch --test-only for the default shape."""
        c = self.config
        try:
            cluster = self.backend.cluster_info(c.partition)
        except BatchError as exc:
            return ClusterSnapshot(taken=time.time(), error=str(exc))
        try:
            queue = self.backend.queue_length(cluster.partition)
        except BatchError as exc:
            log.debug("queue_length failed: %s", exc)
            queue = None
        taken = time.time()
        impossible = None
        try:
            est, known = self.backend.estimate_start(self._default_spec()), True
        except BatchSubmitError as exc:     # the default job shape can never run here
            est, known, impossible = None, False, str(exc)
        except BatchError as exc:
            log.debug("estimate_start failed: %s", exc)
            est, known = None, False
        return ClusterSnapshot(taken=taken, cluster=cluster, queue_length=queue, est_start=est,
                               est_start_known=known, impossible=impossible)

    async def _estimate_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.estimate_interval)
            try:
                snap = await self._in(self._watch_pool, self._take_snapshot)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                log.exception("batch SeD %s: cluster snapshot failed", self.name)
                continue
            self._snapshot = snap
            self._submitted_since = [(t, n) for t, n in self._submitted_since if t >= snap.taken]

    # ------------------------------------------------------------------ introspection
    def _load(self, r: Replica) -> dict:
        load = super()._load(r)
        snap = self._snapshot
        load.update(server_type="batch", jobs=len(self._by_job),
                    free_cpu=(snap.cluster.free_cpus / snap.cluster.total_cpus)
                    if snap is not None and snap.cluster is not None and snap.cluster.total_cpus else None)
        return load

    def jobs(self) -> dict[str, dict]:
        """Call id -> {job_id, state, service, user} of the live and kept calls."""
        out = {}
        for src in (self._jobs, self._cancelling, self._undelivered):
            for cid, j in src.items():
                out[cid] = {"job_id": j.job_id, "state": j.state, "service": j.service, "user": j.user,
                            "dir": j.dir}
        return out

    def statistics(self) -> dict:
        s = super().statistics()
        s.update(server_type="batch", batch=dict(self.batch_stats), jobs=len(self._by_job),
                 undelivered=len(self._undelivered), cancelling=len(self._cancelling))
        return s
