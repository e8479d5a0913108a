"""What the batch back-end learns from the scheduler, always in threads:

- the states of its jobs: one ``states()`` for all of them every
  ``poll_interval``; a final state ends the call's wait (:mod:`.jobs`);
- a snapshot of the cluster (its resources, the pending queue, the
  scheduler's start estimate for the default job shape) every ``estimate_interval``, so
  that discovery never waits on the scheduler; the estimation tags are
  computed from it with the SeD's own jobs
  (:func:`~gridrpc.sed.batch.estimate.batch_tags`).

A mixin of :class:`~gridrpc.sed.batch.jobs.BatchJobs`."""
from __future__ import annotations

import asyncio
import logging
import os
import time

from .base import BatchError, BatchSubmitError, JobInfo, JobSpec, JobState
from .estimate import ClusterSnapshot, batch_tags
from .state import CallJob

log = logging.getLogger("gridrpc.sed.batch.sed")
_SWEEP_EVERY = 300.0


class ClusterViewMixin:
    _snapshot: ClusterSnapshot | None = None

    def estimate(self, replica, service, user: str | None, now: float) -> dict:
        c = self.config
        tcomp, source = self.history.predict(service.name, user, c.time_limit)
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
        sch = replica.scheduler
        return batch_tags(
            now=now, snapshot=snap, tcomp=tcomp, tcomp_source=source,
            cpus_per_job=max(c.nodes or 1, (c.ntasks or 1) * (c.cpus_per_task or 1)),
            walltime=c.time_limit, num_pending=len(pending), num_running=len(running),
            own_running=own_running,
            own_pending_cpus=sum(j.cpus for j in pending if (j.submitted or now) < since),
            queued_here=len(sch.requests) - len(sch.running),
            submitted_cpus_since=sum(n for t, n in self._submitted_since if t >= since),
            max_jobs=c.max_jobs, last_solve=replica.last_solve, scheduler=c.scheduler, partition=c.partition)

    def load(self, replica) -> dict:
        snap = self._snapshot
        return {"server_type": "batch", "jobs": len(self._by_job),
                "free_cpu": (snap.cluster.free_cpus / snap.cluster.total_cpus)
                if snap is not None and snap.cluster is not None and snap.cluster.total_cpus else None}

    def _default_spec(self) -> JobSpec:
        c = self.config
        return JobSpec(script="#!/bin/sh\ntrue\n", name=f"gridrpc-{self.sed_name}-estimate",
                       partition=c.partition, account=c.account, time_limit=c.time_limit, nodes=c.nodes,
                       ntasks=c.ntasks, cpus_per_task=c.cpus_per_task, extra_options=c.submit_options)

    def _take_snapshot(self) -> ClusterSnapshot:
        """(thread) The partition's resources, the pending queue, and the start estimate of the default shape."""
        c = self.config
        try:
            cluster = self.scheduler.cluster_info(c.partition)
        except BatchError as exc:
            return ClusterSnapshot(taken=time.time(), error=str(exc))
        try:
            queue = self.scheduler.queue_length(cluster.partition)
        except BatchError as exc:
            log.debug("queue_length failed: %s", exc)
            queue = None
        taken = time.time()
        impossible = None
        try:
            est, known = self.scheduler.estimate_start(self._default_spec()), True
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
                log.exception("batch SeD %s: cluster snapshot failed", self.sed_name)
                continue
            self._snapshot = snap
            self._submitted_since = [(t, n) for t, n in self._submitted_since if t >= snap.taken]

    # ------------------------------------------------------------------ job states
    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_interval)
            try:
                await self._poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep polling
                log.exception("batch SeD %s: poll failed", self.sed_name)

    async def _poll_once(self) -> None:
        if self._by_job:
            self.batch_stats["polls"] += 1
            dirs = {jid: job.dir for jid, job in self._by_job.items()}
            try:
                infos, left = await self._in(self._watch_pool, self._query, dirs)
            except BatchError as exc:
                self.batch_stats["poll_errors"] += 1
                if time.monotonic() - self._poll_error_logged > 60:
                    self._poll_error_logged = time.monotonic()
                    log.warning("batch SeD %s: cannot ask the scheduler about %d job(s): %s",
                                self.sed_name, len(dirs), exc)
                infos, left = {}, set()
            now = time.time()
            for jid, info in infos.items():
                job = self._by_job.get(jid)
                if job is not None:
                    self._on_state(job, info, now, jid in left)
        for job in list(self._cancelling.values()):
            if job.cancel_task is None:
                self._start_cancel(job)
        if time.monotonic() - self._last_sweep > _SWEEP_EVERY:
            self._last_sweep = time.monotonic()
            self._sweep()

    def _query(self, dirs: dict[str, str]) -> tuple[dict[str, JobInfo], set[str]]:
        """(thread) One ``states()`` for every job; and which of the jobs the
        scheduler no longer knows left a result or an error behind."""
        infos = self.scheduler.states(list(dirs))
        left = {jid for jid, info in infos.items() if info.state is JobState.UNKNOWN and jid in dirs and (
            os.path.exists(os.path.join(dirs[jid], "result.json"))
            or os.path.exists(os.path.join(dirs[jid], "error.json")))}
        return infos, left

    def _on_state(self, job: CallJob, info: JobInfo, now: float, left: bool) -> None:
        job.info = info
        if info.state is JobState.UNKNOWN:
            job.unknown_since = job.unknown_since or now
            if not left and now - job.unknown_since < self.config.lost_after:
                return
        else:
            job.unknown_since = None
        if info.start_time and job.started is None and (info.state is JobState.RUNNING or info.state.is_final):
            job.started = info.start_time
        if info.state is JobState.RUNNING and job.state != "running":
            job.started = job.started or now
            job.state = "running"
            if not job.cancel_requested:
                self._save(job)
        elif info.state.is_final or info.state is JobState.UNKNOWN:
            self._by_job.pop(job.job_id, None)
            job.ended = info.end_time or now
            if job.final is not None and not job.final.done():
                job.final.set_result(info)
