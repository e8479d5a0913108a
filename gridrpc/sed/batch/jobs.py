"""The batch back-end: each call of a batch SeD becomes one job of a batch
scheduler (Slurm, Grid Engine, OAR: :mod:`.registry`). See ``docs/batch.md``.

1. the call is accepted and queued like on any SeD (the queue only holds
   calls beyond ``max_jobs``); when it starts, its arguments are written to a
   fresh directory ``<shared_dir>/<SeD>/jobs/<unique name>/`` (the codec's
   JSON + raw buffers, :mod:`.jobfiles`; files sent with the call too), and a
   job script running ``<remote_python> -m gridrpc.sed.batch.run_job <dir>``
   is submitted through the scheduler interface (:class:`~.base.BatchBackend`)
   in a thread (the submit command blocks);
2. one background task polls *all* jobs with one ``states()`` per
   ``poll_interval``; when a job is final its result (or the service's
   exception) is read back from the directory (:mod:`.replies`), and a job
   that ended without one becomes a RemoteError naming the job;
3. cancelling a call cancels its job (``cancel`` checks it is gone) and then
   removes the directory.

Restarts (:mod:`.state`): ``meta.json`` in each call directory is the SeD's
state. A SeD started with the same name and shared directory picks the jobs
up again, keeps each outcome until the client asks (its ping, or the same
CALL again, gets the answer), and answers calls whose job was never submitted.
ACCEPTED carries ``patience`` (``restart_grace``): clients wait that long for
a silent batch SeD before failing the call over.

No file is read or written on the event loop: scheduler commands run in two
thread pools (submissions and cancels never hold up polls and snapshots),
state files in one I/O thread, arguments and results in worker threads.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import importlib
import logging
import os
import sys
import time
import uuid
from typing import ClassVar

from ...core import messages as m
from ...core.sed_calls import CallState
from ...errors import ConfigError, InvalidArgument
from ..backends import BaseBackend, Outcome
from . import jobfiles
from .base import BatchBackend, BatchError, BatchSubmitError, JobSpec
from .cluster import ClusterViewMixin
from .config import CALL_OPTION, BatchConfig, parse_call_request
from .estimate import JobHistory
from .replies import JobOutcomeMixin
from .state import CallJob, StateDirMixin

log = logging.getLogger("gridrpc.sed.batch.sed")


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


class ImportableServices:
    """Services of a back-end whose calls run in other processes that import
    them: each one is kept as ``module:function`` in ``targets`` (a function
    given here must be importable there)."""
    targets: dict[str, str]

    def check_service(self, name, fn) -> None:
        if not isinstance(fn, str):
            importable_target(fn)

    def services_changed(self, name, fn) -> None:
        if fn is None:
            self.targets.pop(name, None)
        else:
            self.targets[name] = fn if isinstance(fn, str) else importable_target(fn)


class BatchJobs(ImportableServices, StateDirMixin, JobOutcomeMixin, ClusterViewMixin, BaseBackend):
    """Calls as batch jobs (see the module doc). Trade-offs: whole clusters
    behind one SeD, the scheduler's policies and accounting apply; a job per
    call costs seconds (submission, scheduling, start), so it suits calls of
    minutes and more; the shared directory must be visible from the nodes."""
    name: ClassVar[str] = "batch"
    server_type = "batch"
    remote = True
    push_estimation = False     # estimations depend on the user (per-user run-time history): fan-out
    where = "batch jobs"

    def __init__(self, sed_name: str, config: BatchConfig, scheduler: BatchBackend) -> None:
        self.sed_name = sed_name
        self.config = config
        self.scheduler = scheduler
        self.state_dir = os.path.join(config.state_root, jobfiles.safe_name(sed_name))
        self.jobs_dir = os.path.join(self.state_dir, "jobs")
        self.targets: dict[str, str] = {}          # service -> module:function run by the jobs
        self.history = JobHistory()
        self.records: list[dict] = []              # finished jobs: predicted vs actual (docs, tests)
        self.batch_stats = {"submitted": 0, "completed": 0, "failed": 0, "cancelled": 0,
                            "recovered": 0, "submit_errors": 0, "polls": 0, "poll_errors": 0}
        self._jobs: dict[str, CallJob] = {}         # call id -> job of a live call
        self._by_job: dict[str, CallJob] = {}       # scheduler job id -> job being polled
        self._cancelling: dict[str, CallJob] = {}   # call id -> job whose cancel is not verified yet
        self._undelivered: dict[str, CallJob] = {}  # call id -> finished job nobody asked for yet
        self._files: dict[str, list] = {}          # call directory -> files sent with the call, to write
        self._submitted_since: list[tuple[float, int]] = []
        self._bg: set[asyncio.Task] = set()
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self._last_sweep = 0.0
        self._poll_error_logged = 0.0
        self._cmd_pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix=f"{sed_name}-batch-cmd")
        self._watch_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix=f"{sed_name}-batch-poll")
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{sed_name}-batch-io")

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await asyncio.to_thread(os.makedirs, self.jobs_dir, exist_ok=True)
        await asyncio.to_thread(self._load_history)
        found = await asyncio.to_thread(self._scan)
        self._snapshot = await self._in(self._watch_pool, self._take_snapshot)
        self._recover(found)
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self._poll_loop()), loop.create_task(self._estimate_loop())]
        log.info("batch SeD %s: scheduler %s, partition %s, shared directory %s, %d job(s) recovered",
                 self.sed_name, self.config.scheduler, self.config.partition or "(default)", self.state_dir,
                 self.batch_stats["recovered"])

    async def close(self) -> None:
        self._closing = True
        wait = self.config.command_timeout + 5
        submits = [j.submit_task for j in self._jobs.values() if j.submit_task and not j.submit_task.done()]
        if submits:    # let the submission answer, so the job ids are recorded for a restart
            await asyncio.wait(submits, timeout=wait)
        if self.config.cancel_on_exit:
            for cid, call in list(self.sed.calls.items()):
                job = self._jobs.get(cid)
                if job is not None:
                    job.cancel_requested = True
                    self._cancelling[cid] = job
                    self._start_cancel(job)
                self.sed.answer(call, m.error_header(cid, "cancelled", f"batch SeD {self.sed_name} stopped "
                                                     "(cancel_on_exit): job cancelled", **self.sed.timing(call)),
                                ok=False)
        cancels = [j.cancel_task for j in self._cancelling.values() if j.cancel_task]
        if cancels:
            await asyncio.wait(cancels, timeout=self.config.cancel_timeout + wait)
        for t in self._tasks:
            t.cancel()
        if self._bg:
            await asyncio.wait(list(self._bg), timeout=wait)
        await self._flush_io()
        for pool in (self._cmd_pool, self._watch_pool, self._io):
            pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _in(pool: concurrent.futures.ThreadPoolExecutor, fn, *args) -> asyncio.Future:
        """Run a blocking command in *pool*: submissions and cancels
        (``_cmd_pool``) never hold up the polls and snapshots (``_watch_pool``)."""
        return asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        return t

    # ------------------------------------------------------------------ a call, received
    def new_workdir(self) -> str:
        # a fresh name per call, never derived from the request id (meta.json records the id)
        return os.path.join(self.jobs_dir, f"{time.time_ns():x}-{uuid.uuid4().hex[:8]}", "files")

    def file_sink(self, workdir: str):
        return jobfiles.LaterFiles(workdir, self._files.setdefault(workdir, []))

    def remove_workdir(self, workdir: str) -> None:
        self._files.pop(workdir, None)
        self._remove_path(os.path.dirname(workdir))

    def prepare(self, service, kwargs, header, buffers) -> tuple[dict, dict]:
        if CALL_OPTION not in kwargs:
            return kwargs, {}
        kwargs = dict(kwargs)
        return kwargs, parse_call_request(kwargs.pop(CALL_OPTION), self.config)

    def ack_fields(self, call) -> dict:
        return {"patience": self.config.restart_grace}

    def timing(self, call) -> dict:
        job = self._jobs.get(call.id)
        if job is None:
            return {}
        t = {"submitted": job.submitted, "job_started": job.started, "job_ended": job.ended, "job_id": job.job_id}
        if job.started:
            t["started"] = job.started
        return t

    # ------------------------------------------------------------------ a call, run as a job
    async def run(self, call) -> Outcome | None:
        job = self._jobs.get(call.id) or self._new_job(call)
        if job.job_id is None:
            failure = await self._submit(call, job)
            if failure is not None:
                return failure
        info = await job.final
        outcome, out_tail, began = await asyncio.to_thread(self._collect, job, info)
        if self.sed.calls.get(call.id) is not call or call.state is not CallState.RUNNING:
            return None
        self._observe(job, info, outcome, began)
        return self._reply(call.id, job, info, outcome, out_tail)

    def _new_job(self, call) -> CallJob:
        c, o = self.config, call.options
        nodes = o.get("nodes", c.nodes) or 1
        tasks = o.get("ntasks", c.ntasks) or 1
        cpt = o.get("cpus_per_task", c.cpus_per_task) or 1
        job = CallJob(call_id=call.id, dir=os.path.dirname(call.workdir), service=call.service, user=call.user,
                      received=call.received, options=dict(o), walltime=o.get("walltime", c.time_limit),
                      cpus=max(nodes, tasks * cpt))
        job.final = asyncio.get_running_loop().create_future()
        vec = self.sed.estimate(call.replica, call.svc, [], user=call.user)
        tcomp, source = self.history.predict(job.service, job.user, job.walltime)
        job.predicted = {"est_wait": vec.get("est_wait"), "est_wait_source": vec.get("est_wait_source"),
                         "est_wait_scheduler": vec.get("est_wait_scheduler"),
                         "tcomp": tcomp, "tcomp_source": source}
        self._jobs[call.id] = job
        return job

    def _job_name(self, service: str) -> str:
        return f"gridrpc-{self.sed_name}-{service}"[:64]

    def _job_spec(self, call, job: CallJob) -> JobSpec:
        c, o = self.config, call.options
        spec = JobSpec(
            script="#!/bin/sh\n", name=self._job_name(job.service), workdir=job.dir,
            partition=c.partition, account=c.account, time_limit=job.walltime,
            nodes=o.get("nodes", c.nodes), ntasks=o.get("ntasks", c.ntasks),
            cpus_per_task=o.get("cpus_per_task", c.cpus_per_task),
            output=os.path.join(job.dir, "job.out"), extra_options=c.submit_options,
            env={**c.job_env, "GRIDRPC_CALL_ID": call.id, "GRIDRPC_CALL_DIR": job.dir},
            # a non-idempotent call is never run again by the scheduler on its own (node failure,
            # preemption): its job ends and the call fails, naming the job
            requeue=None if call.svc.idempotent else False)
        command = [c.remote_python, "-m", "gridrpc.sed.batch.run_job", job.dir]
        return dataclasses.replace(spec, script=self.scheduler.render_script(spec, command))

    async def _submit(self, call, job: CallJob) -> Outcome | None:
        """Write the call's files and submit its job; an Outcome if that failed."""
        target = self.targets.get(job.service)
        try:
            if target is None:
                raise ConfigError(f"service {job.service!r} has no module:function for the jobs")
            if not job.written:
                files = self._files.pop(call.workdir, []) if call.workdir else []
                await asyncio.to_thread(self._write_call, job, target, call.args, call.kwargs, files)
                job.written = True
                call.args, call.kwargs = [], {}      # on disk now: free the memory
            spec = self._job_spec(call, job)
        except (ConfigError, InvalidArgument, OSError, ValueError) as exc:
            return self._failure("BatchSubmitError", f"cannot prepare the job of call {call.id}: {exc}")
        job.state = "submitting"
        job.submitted = time.time()
        await self._save(job)                   # on disk before the submission may run (restarts)
        self._io_call(jobfiles.write_script, job.dir, spec.script)     # for people reading the directory
        snap = self._snapshot
        check = bool(call.options) or (snap is not None and snap.impossible is not None)
        fut = asyncio.ensure_future(self._in(self._cmd_pool, self._checked_submit, spec, check))
        job.submit_task = fut
        fut.add_done_callback(lambda f, job=job: self._submitted(job, f))
        try:
            await asyncio.shield(fut)
        except BatchError as exc:
            self.batch_stats["submit_errors"] += 1
            return self._failure("BatchSubmitError", f"the {self.config.scheduler} scheduler refused "
                                 f"the job of call {call.id}: {exc}")
        return None

    @staticmethod
    def _write_call(job: CallJob, target: str, args, kwargs, files: list) -> None:
        """(thread) The call's directory: files sent with it, its arguments."""
        os.makedirs(job.dir, exist_ok=True)
        jobfiles.write_files(files)
        jobfiles.write_call(job.dir, target=target, service=job.service, call_id=job.call_id,
                            args=args, kwargs=kwargs)

    def _checked_submit(self, spec: JobSpec, check: bool) -> str:
        """(thread) Submit; a shape other than the default one is first tried
        with ``estimate_start`` (a test submission): some schedulers accept
        jobs no node can ever hold, and they would pend forever."""
        if check:
            try:
                self.scheduler.estimate_start(spec)
            except BatchSubmitError:
                raise
            except BatchError as exc:      # no estimate: not a refusal
                log.debug("estimate before submitting failed: %s", exc)
        return self.scheduler.submit(spec)

    def _submitted(self, job: CallJob, fut: asyncio.Future) -> None:
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
        log.info("batch SeD %s: call %s (%s) is job %s", self.sed_name, job.call_id, job.service, job.job_id)

    def _failure(self, type_: str, message: str) -> Outcome:
        log.warning("batch SeD %s: %s", self.sed_name, message)
        self.batch_stats["failed"] += 1
        return Outcome(ok=False, error=(type_, message, ""))

    # ------------------------------------------------------------------ a call, answered
    def finished(self, call, header: dict, frames: list, delivered: bool) -> None:
        if call.workdir:
            self._files.pop(call.workdir, None)
        job = self._jobs.pop(call.id, None)
        if job is None:                      # never became a job (cancelled while queued, shut down)
            if call.workdir:
                self.remove_workdir(call.workdir)
            return
        if job.cancel_requested:
            return                           # the cancel removes the directory once the job is gone
        if delivered or header.get("error", {}).get("kind") == "cancelled":
            self._remove_dir(job)
        else:
            self._keep_reply(job, header, frames)

    # ------------------------------------------------------------------ cancel
    def kill(self, call) -> bool:
        if call.task:
            call.task.cancel()          # it only waits; a submission in flight is shielded
        job = self._jobs.get(call.id)
        if job is not None:
            job.cancel_requested = True
            self._cancelling[call.id] = job
            self._start_cancel(job)
        return True

    def _start_cancel(self, job: CallJob) -> None:
        if job.cancel_task is not None and not job.cancel_task.done():
            return
        job.state = "cancelling" if job.job_id or job.submit_task else job.state
        self._save(job)
        job.cancel_task = self._spawn(self._cancel_job(job))

    async def _cancel_job(self, job: CallJob) -> None:
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
                self.scheduler.cancel, job.job_id, timeout=self.config.cancel_timeout))
        except BatchError as exc:
            log.error("batch SeD %s: cannot cancel job %s of call %s: %s (retried at the next poll)",
                      self.sed_name, job.job_id, job.call_id, exc)
            job.cancel_task = None
            return
        log.info("batch SeD %s: job %s of call %s cancelled (%s)", self.sed_name, job.job_id, job.call_id,
                 info.raw_state or info.state.value)
        self.batch_stats["cancelled"] += 1
        self._by_job.pop(job.job_id, None)
        self._cancelling.pop(job.call_id, None)
        self._remove_dir(job)

    # ------------------------------------------------------------------ introspection
    def jobs(self) -> dict[str, dict]:
        """Call id -> {job_id, state, service, user, dir} of the live and kept calls."""
        out = {}
        for src in (self._jobs, self._cancelling, self._undelivered):
            for cid, j in src.items():
                out[cid] = {"job_id": j.job_id, "state": j.state, "service": j.service, "user": j.user,
                            "dir": j.dir}
        return out

    def statistics(self) -> dict:
        return {"server_type": "batch", "batch": dict(self.batch_stats), "jobs": len(self._by_job),
                "undelivered": len(self._undelivered), "cancelling": len(self._cancelling)}
