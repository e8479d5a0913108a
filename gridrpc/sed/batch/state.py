"""The batch SeD's state directory: one ``meta.json`` per call (the SeD's
memory across restarts), the run-time history, recovery after a restart and
the sweep of unfetched answers and stray directories. A mixin of
:class:`~gridrpc.sed.batch.sed.BatchSeD`, which owns the attributes it uses."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field

from ...core import messages as m
from ...core.queue import Request
from ..server import _Call
from ..services import Service
from . import jobfiles
from .base import JobInfo
from .estimate import RunRecord

log = logging.getLogger("gridrpc.sed.batch.sed")


def _runs_as_job(*args, **kwargs):  # pragma: no cover - never called in the SeD
    raise RuntimeError("this service runs in batch jobs only")


@dataclass
class _Job:
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
    reply: list | None = None   # frames kept for a client that has not asked yet

    _SAVED = ("call_id", "service", "user", "received", "options", "walltime", "cpus", "state",
              "written", "job_id", "submitted", "started", "ended", "predicted", "cancel_requested")

    def meta(self) -> dict:
        return {"v": 1, **{k: getattr(self, k) for k in self._SAVED}}

    @classmethod
    def from_meta(cls, d: str, meta: dict) -> "_Job":
        kw = {k: meta[k] for k in cls._SAVED if k in meta}
        return cls(dir=d, **kw)


class StateDirMixin:
    # ------------------------------------------------------------------ state directory
    def _save(self, job: _Job) -> None:
        try:
            jobfiles.write_json(os.path.join(job.dir, "meta.json"), job.meta())
        except OSError as exc:
            log.error("batch SeD %s: cannot save the state of call %s in %s: %s", self.name,
                      job.call_id, job.dir, exc)

    def _remove_dir(self, job: _Job) -> None:
        if self._batch_closing:
            shutil.rmtree(job.dir, ignore_errors=True)
        else:
            self._spawn(asyncio.to_thread(shutil.rmtree, job.dir, True))

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
        try:
            with open(os.path.join(self.state_dir, "history.jsonl"), "a") as fh:
                fh.write(json.dumps(rec.to_json()) + "\n")
        except OSError as exc:
            log.warning("batch SeD %s: cannot append to the run-time history: %s", self.name, exc)

    def _scan(self) -> list[tuple[str, dict]]:
        found = []
        for entry in sorted(os.listdir(self.jobs_dir)):
            d = os.path.join(self.jobs_dir, entry)
            try:
                meta = jobfiles.read_json(os.path.join(d, "meta.json"))
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                log.error("batch SeD %s: unreadable state %s/meta.json (%s); left alone", self.name, d, exc)
                continue
            if isinstance(meta, dict) and isinstance(meta.get("call_id"), str):
                found.append((d, meta))
        found.sort(key=lambda x: x[1].get("received") or 0.0)
        return found

    def _recover(self, found: list[tuple[str, dict]]) -> None:
        """Take back the calls of a previous run of this SeD (see module doc)."""
        loop = asyncio.get_running_loop()
        r = self._replica
        for d, meta in found:
            try:
                job = _Job.from_meta(d, meta)
            except TypeError as exc:
                log.error("batch SeD %s: bad state in %s (%s); left alone", self.name, d, exc)
                continue
            job.final = loop.create_future()
            cid = job.call_id
            self.batch_stats["recovered"] += 1
            if job.state == "done":
                self._undelivered[cid] = job
                continue
            if job.job_id is None:      # stopped while sbatch ran: did the job start?
                started = _read_started(d)
                if started.get("job_id"):
                    job.job_id, job.state = str(started["job_id"]), "submitted"
            if job.cancel_requested:
                self._cancelling[cid] = job
                if job.job_id:
                    self._by_job[job.job_id] = job
                self._start_cancel(job)
                continue
            if job.job_id is None:
                job.ended = time.time()
                self._keep_reply(job, m.error_header(
                    cid, "remote", f"batch SeD {self.name} stopped while submitting the job of call "
                    f"{cid}; whether the scheduler got it is unknown (job name "
                    f"{self._job_name(job.service)}, directory {d})", type_="BatchJobLost",
                    server=self.name, timing={"received": job.received, "ended": job.ended}), [])
                continue
            svc = self.services.get(job.service) or Service(name=job.service, fn=_runs_as_job)
            call = _Call(id=cid, route=[], replica=r, service=svc, args=[], kwargs={}, user=job.user,
                         optional=False, received=job.received, options=dict(job.options),
                         workdir=None)
            call.started = job.started or job.submitted
            self.calls[cid] = call
            self._jobs[cid] = job
            if job.job_id:
                self._by_job[job.job_id] = job
            log.info("batch SeD %s: recovered call %s (%s, job %s, %s)", self.name, cid, job.service,
                     job.job_id or "not submitted yet", job.state)
            self._apply(r, r.scheduler.submit(Request(id=cid, user=job.user, service=job.service,
                                                      submitted=job.received), time.time()))

    def _sweep(self) -> None:
        """Drop answers nobody fetched within ``result_retention``, and
        directories of calls refused before they became jobs."""
        now = time.time()
        for cid, job in list(self._undelivered.items()):
            if now - (job.ended or job.received) > self.config.result_retention:
                log.warning("batch SeD %s: answer of call %s (job %s) never fetched; removed",
                            self.name, cid, job.job_id)
                self._undelivered.pop(cid, None)
                self._remove_dir(job)
        known = {os.path.basename(j.dir) for src in (self._jobs, self._cancelling, self._undelivered)
                 for j in src.values()} | {jobfiles.safe_name(c) for c in self.calls}
        self._spawn(asyncio.to_thread(_remove_strays, self.jobs_dir, known, now - 3600.0))


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


def _read_started(d: str) -> dict:
    try:
        v = jobfiles.read_json(os.path.join(d, "started.json"))
        return v if isinstance(v, dict) else {}
    except (OSError, ValueError):
        return {}
