"""The batch back-end's state directory: one ``meta.json`` per call (the
SeD's memory across restarts), the run-time history, answers kept for clients
that were away, recovery after a restart and the sweep of unfetched answers
and stray directories. A mixin of :class:`~gridrpc.sed.batch.jobs.BatchJobs`,
which owns the attributes it uses.

Every file is written and read off the event loop: state files, histories and
kept answers through one I/O thread (``_io``, first in first out, so the
successive states of a call land in order), the call's arguments and results
in other threads (:mod:`.jobs`)."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field

from ...core import messages as m
from ..calls.receive import LiveCall
from ..services import Service
from . import jobfiles
from .base import JobInfo
from .estimate import RunRecord

log = logging.getLogger("gridrpc.sed.batch.sed")


def _runs_as_job(*args, **kwargs):  # pragma: no cover - never called in the SeD
    raise RuntimeError("this service runs in batch jobs only")


@dataclass
class CallJob:
    """One call's job, mirrored in ``meta.json``."""
    call_id: str
    dir: str
    service: str
    user: str
    received: float
    options: dict = field(default_factory=dict)
    walltime: float | None = None
    cpus: int = 1
    state: str = "new"          # new | submitting | submitted | running | done | cancelling
    written: bool = False       # call.json written
    job_id: str | None = None
    submitted: float | None = None
    started: float | None = None
    ended: float | None = None
    predicted: dict = field(default_factory=dict)   # est_wait/tcomp when submitted
    # runtime only
    info: JobInfo | None = None
    final: asyncio.Future | None = None
    submit_task: asyncio.Future | None = None
    cancel_requested: bool = False
    cancel_task: asyncio.Task | None = None
    unknown_since: float | None = None

    _SAVED = ("call_id", "service", "user", "received", "options", "walltime", "cpus", "state",
              "written", "job_id", "submitted", "started", "ended", "predicted", "cancel_requested")

    def meta(self) -> dict:
        return {"v": 1, **{k: getattr(self, k) for k in self._SAVED}}

    @classmethod
    def from_meta(cls, d: str, meta: dict) -> "CallJob":
        kw = {k: meta[k] for k in cls._SAVED if k in meta}
        return cls(dir=d, **kw)


class StateDirMixin:
    # ------------------------------------------------------------------ file I/O, off the loop
    def _io_call(self, fn, *args) -> asyncio.Future:
        """Run ``fn(*args)`` in the I/O thread (in submission order)."""
        return asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    def _save(self, job: CallJob) -> asyncio.Future:
        """Write the job's ``meta.json`` (its state as of now); await to be sure it is on disk."""
        return self._io_call(self._write_meta, job.dir, job.call_id, job.meta())

    def _write_meta(self, d: str, cid: str, meta: dict) -> None:
        try:
            jobfiles.write_json(os.path.join(d, "meta.json"), meta)
        except OSError as exc:
            log.error("batch SeD %s: cannot save the state of call %s in %s: %s", self.sed_name, cid, d, exc)

    def _remove_dir(self, job: CallJob) -> None:
        self._remove_path(job.dir)

    def _remove_path(self, path: str) -> None:
        self._io_call(shutil.rmtree, path, True)

    async def _flush_io(self) -> None:
        await self._io_call(lambda: None)

    def _load_history(self) -> None:
        path = os.path.join(self.state_dir, "history.jsonl")
        try:
            with open(path) as fh:
                lines = fh.readlines()[-2000:]
        except OSError:
            return
        for line in lines:
            try:
                self.history.observe(RunRecord.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue

    def _append_history(self, rec: RunRecord) -> None:
        self.history.observe(rec)
        self._io_call(self._write_history, json.dumps(rec.to_json()) + "\n")

    def _write_history(self, line: str) -> None:
        try:
            with open(os.path.join(self.state_dir, "history.jsonl"), "a") as fh:
                fh.write(line)
        except OSError as exc:
            log.warning("batch SeD %s: cannot append to the run-time history: %s", self.sed_name, exc)

    # ------------------------------------------------------------------ answers kept for later
    def _keep_reply(self, job: CallJob, header: dict, frames: list) -> None:
        """Nobody to answer now (the client will ask again): keep the answer
        on disk until it is fetched (or ``result_retention`` passes)."""
        job.state = "done"
        self._undelivered[job.call_id] = job
        self.sed.lifecycle.hold(job.call_id, frames)
        self._io_call(self._write_reply, job, header, frames[1:])
        self._save(job)

    def _write_reply(self, job: CallJob, header: dict, buffers: list) -> None:
        try:
            jobfiles.write_reply(job.dir, header, buffers)
        except OSError as exc:
            log.error("batch SeD %s: cannot keep the answer of %s on disk: %s", self.sed_name, job.call_id, exc)

    async def fetch_kept(self, call_id: str) -> list | None:
        job = self._undelivered.get(call_id)
        if job is None:
            return None
        try:
            got = await self._io_call(jobfiles.read_reply, job.dir)
        except (OSError, ValueError) as exc:
            log.error("batch SeD %s: cannot read the kept answer of %s: %s", self.sed_name, call_id, exc)
            return None
        if got is None:
            return None
        header, buffers = got
        return [m.dumps(header), *buffers]

    def kept_delivered(self, call_id: str) -> None:
        job = self._undelivered.pop(call_id, None)
        if job is not None:
            log.info("batch SeD %s: delivered the kept answer of %s (job %s)", self.sed_name, call_id, job.job_id)
            self._remove_dir(job)

    # ------------------------------------------------------------------ restarts
    def _scan(self) -> list[tuple[str, dict, dict]]:
        """(thread) ``(directory, meta.json, started.json)`` of each call of a previous run."""
        found = []
        for entry in sorted(os.listdir(self.jobs_dir)):
            d = os.path.join(self.jobs_dir, entry)
            try:
                meta = jobfiles.read_json(os.path.join(d, "meta.json"))
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                log.error("batch SeD %s: unreadable state %s/meta.json (%s); left alone", self.sed_name, d, exc)
                continue
            if isinstance(meta, dict) and isinstance(meta.get("call_id"), str):
                found.append((d, meta, jobfiles.read_started(d) if meta.get("job_id") is None else {}))
        found.sort(key=lambda x: x[1].get("received") or 0.0)
        return found

    def _recover(self, found: list[tuple[str, dict, dict]]) -> None:
        """Take back the calls of a previous run of this SeD (see the module doc of :mod:`.jobs`)."""
        loop = asyncio.get_running_loop()
        sed = self.sed
        r = next(iter(sed.replicas.values()))
        for d, meta, started in found:
            try:
                job = CallJob.from_meta(d, meta)
            except TypeError as exc:
                log.error("batch SeD %s: bad state in %s (%s); left alone", self.sed_name, d, exc)
                continue
            cid = job.call_id
            if not m.valid_id(cid):
                log.error("batch SeD %s: bad call id in %s; left alone", self.sed_name, d)
                continue
            job.final = loop.create_future()
            self.batch_stats["recovered"] += 1
            if job.state == "done":
                self._undelivered[cid] = job
                sed.lifecycle.hold(cid)
                continue
            if job.job_id is None and started.get("job_id"):    # stopped while the submission ran: it did
                job.job_id, job.state = str(started["job_id"]), "submitted"
            if job.cancel_requested:
                self._cancelling[cid] = job
                sed.lifecycle.remember(cid)                       # never run again
                if job.job_id:
                    self._by_job[job.job_id] = job
                self._start_cancel(job)
                continue
            if job.job_id is None:
                job.ended = time.time()
                header = m.error_header(
                    cid, "remote", f"batch SeD {self.sed_name} stopped while submitting the job of call "
                    f"{cid}; whether the scheduler got it is unknown (job name "
                    f"{self._job_name(job.service)}, directory {d})", type_="BatchJobLost",
                    server=self.sed_name, timing={"received": job.received, "ended": job.ended})
                self._keep_reply(job, header, [m.dumps(header)])
                continue
            svc = sed.services.get(job.service) or Service(name=job.service, fn=_runs_as_job)
            call = LiveCall(id=cid, sed=r.name, service=job.service, user=job.user, received=job.received,
                            route=[], replica=r, svc=svc, args=[], kwargs={}, options=dict(job.options))
            call.started = job.started or job.submitted
            self._jobs[cid] = job
            if job.job_id:
                self._by_job[job.job_id] = job
            log.info("batch SeD %s: recovered call %s (%s, job %s, %s)", self.sed_name, cid, job.service,
                     job.job_id or "not submitted yet", job.state)
            sed.admit(call)

    def _sweep(self) -> None:
        """Drop answers nobody fetched within ``result_retention``, and
        directories of calls refused before they became jobs."""
        now = time.time()
        for cid, job in list(self._undelivered.items()):
            if now - (job.ended or job.received) > self.config.result_retention:
                log.warning("batch SeD %s: answer of call %s (job %s) never fetched; removed",
                            self.sed_name, cid, job.job_id)
                self._undelivered.pop(cid, None)
                self.sed.lifecycle.release(cid)
                self._remove_dir(job)
        known = {os.path.basename(j.dir) for src in (self._jobs, self._cancelling, self._undelivered)
                 for j in src.values()}
        known |= {os.path.basename(os.path.dirname(c.workdir)) for c in self.sed.calls.values() if c.workdir}
        known |= {jobfiles.safe_name(c) for c in self.sed.calls}
        self._io_call(_remove_strays, self.jobs_dir, known, now - 3600.0)


def _remove_strays(jobs_dir: str, known: set[str], before: float) -> None:
    """(thread) Remove call directories without ``meta.json`` that no call
    owns and that have not changed since *before*."""
    try:
        entries = os.listdir(jobs_dir)
    except OSError:
        return
    for entry in entries:
        d = os.path.join(jobs_dir, entry)
        try:
            if entry in known or os.path.exists(os.path.join(d, "meta.json")) or os.path.getmtime(d) > before:
                continue
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)

