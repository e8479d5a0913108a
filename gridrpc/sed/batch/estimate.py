"""Estimation for the batch SeD (pure: no I/O, no clock).

Two parts:

- :class:`JobHistory` predicts the run time of a call from past jobs: the
  mean of the *same user's* last two runs of the service (Tsafrir, Etsion &
  Feitelson, "Backfilling using system-generated predictions rather than user
  runtime estimates", 2007 -- the predictor Guim Bernat's batch-aware
  meta-scheduling work builds on), falling back to the service's recent runs
  by any user, then to the walltime the job asks for (the user's own
  estimate), then to a fixed guess. The source of the value is reported
  (``tcomp_source``) so a client can tell a learnt value from a guess.
- :func:`batch_tags` builds the batch part of the estimation vector from a
  snapshot of the cluster (its resources, the pending queue, the scheduler's
  start estimate for the default job shape) and what this SeD knows of its
  own jobs.

``est_wait`` is the scheduler's own start estimate when it has one
(``est_wait_source: scheduler``). Slurm, for one, computes it from the *time limits* of
running and higher-priority jobs, so it is an upper bound when jobs end
early, and ``None`` behind jobs without a limit; then a coarse queue model
is used (``model``). Jobs this SeD submitted since the snapshot are counted
against the free CPUs of the snapshot, so a burst of discoveries does not all
see the same idle cluster.
"""
from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .base import ClusterInfo

__all__ = ["JobHistory", "RunRecord", "ClusterSnapshot", "batch_tags", "own_wait", "DEFAULT_TCOMP",
           "UNREACHABLE_WAIT"]

#: run time guessed when nothing is known (no history, no walltime, unlimited partition)
DEFAULT_TCOMP = 60.0
#: ``est_wait`` of a cluster that cannot be asked (it loses least_wait_time)
UNREACHABLE_WAIT = 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """One finished job of a service."""
    service: str
    user: str
    run: float                    # seconds the job ran (scheduler start -> end)
    wait: float | None = None     # seconds it waited in the queue
    walltime: float | None = None # the time limit it asked for
    nodes: int | None = None
    time: float = 0.0             # when it ended (POSIX)

    def to_json(self) -> dict:
        return {"service": self.service, "user": self.user, "run": self.run, "wait": self.wait,
                "walltime": self.walltime, "nodes": self.nodes, "time": self.time}

    @classmethod
    def from_json(cls, d: dict) -> "RunRecord":
        return cls(service=str(d["service"]), user=str(d["user"]), run=float(d["run"]),
                   wait=None if d.get("wait") is None else float(d["wait"]),
                   walltime=None if d.get("walltime") is None else float(d["walltime"]),
                   nodes=d.get("nodes"), time=float(d.get("time") or 0.0))


@dataclass
class JobHistory:
    """Past run times per (service, user) and per service.

    ``predict`` returns ``(seconds, source)``, source one of ``user``
    (mean of this user's last ``per_user`` runs), ``service`` (mean of the
    last ``per_service`` runs by anyone), ``walltime`` (the requested time
    limit), ``default``. Predictions never exceed the walltime: a job cannot
    run longer."""
    per_user: int = 2
    per_service: int = 10
    default: float = DEFAULT_TCOMP
    _user: dict[tuple[str, str], collections.deque] = field(default_factory=dict)
    _service: dict[str, collections.deque] = field(default_factory=dict)

    def observe(self, rec: RunRecord) -> None:
        if not math.isfinite(rec.run) or rec.run < 0:
            return
        self._user.setdefault((rec.service, rec.user),
                              collections.deque(maxlen=self.per_user)).append(rec.run)
        self._service.setdefault(rec.service, collections.deque(maxlen=self.per_service)).append(rec.run)

    def predict(self, service: str, user: str | None, walltime: float | None) -> tuple[float, str]:
        runs = self._user.get((service, user)) if user is not None else None
        if runs:
            value, source = sum(runs) / len(runs), "user"
        elif self._service.get(service):
            runs = self._service[service]
            value, source = sum(runs) / len(runs), "service"
        elif walltime is not None:
            return float(walltime), "walltime"
        else:
            return self.default, "default"
        if walltime is not None:
            value = min(value, walltime)
        return max(value, 1e-3), source

    def count(self, service: str, user: str | None = None) -> int:
        if user is None:
            return len(self._service.get(service, ()))
        return len(self._user.get((service, user), ()))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSnapshot:
    """What the SeD last learnt from the scheduler (refreshed in the background)."""
    taken: float                          # when (POSIX)
    cluster: ClusterInfo | None = None    # None: the scheduler could not be asked
    queue_length: int | None = None       # pending jobs in the partition (everyone's)
    est_start: float | None = None        # seconds until the default shape would start, at `taken`
    est_start_known: bool = False         # the scheduler answered (est_start None = "no idea")
    error: str | None = None              # why the cluster could not be asked
    impossible: str | None = None         # why the default job shape can never run there


def own_wait(*, now: float, free_cpus: int, need: int, running: Sequence[tuple[float, int]]) -> float | None:
    """Seconds until ``need`` CPUs are free if this SeD's running jobs end
    when their *predicted* ends say (``running``: ``(predicted end, cpus)``)
    and nothing else changes; None if even all of them are not enough.
    Whole-cluster CPU counting: node fragmentation is ignored."""
    if free_cpus >= need:
        return 0.0
    have = free_cpus
    for end, cpus in sorted(running):
        have += cpus
        if have >= need:
            return max(0.0, end - now)
    return None


def batch_tags(*, now: float, snapshot: ClusterSnapshot | None, tcomp: float, tcomp_source: str,
               cpus_per_job: int, walltime: float | None, num_pending: int, num_running: int,
               queued_here: int, submitted_cpus_since: int, max_jobs: int,
               last_solve: float | None, scheduler: str, partition: str | None,
               own_running: Sequence[tuple[float, int]] = (), own_pending_cpus: int = 0) -> dict:
    """The estimation vector of a batch SeD for one service (see module doc).

    ``num_pending``/``num_running``: this SeD's jobs in the scheduler;
    ``queued_here``: calls waiting in the SeD (over ``max_jobs``);
    ``submitted_cpus_since``: CPUs of the jobs submitted after the snapshot;
    ``own_running``: ``(predicted end, cpus)`` of this SeD's running jobs;
    ``own_pending_cpus``: CPUs of its jobs that were already pending at the
    snapshot. When nobody else's job is pending, the scheduler's estimate
    (which assumes our running jobs use their whole time limit) is capped by
    the time our own jobs are predicted to free enough CPUs
    (``est_wait_source`` ``...+own``)."""
    tcomp = max(float(tcomp), 1e-3)
    tags: dict = {
        "server_type": "batch", "batch_scheduler": scheduler, "tcomp": tcomp,
        "tcomp_source": tcomp_source, "num_waiting": num_pending + queued_here,
        "num_running": num_running, "max_concurrent": max_jobs,
        "time_since_last_solve": (now - last_solve) if last_solve is not None else 1e9,
        "walltime": walltime,
    }
    c = snapshot.cluster if snapshot is not None else None
    if c is None:
        wait = UNREACHABLE_WAIT
        tags.update(batch_available=False, est_wait_source="unreachable",
                    batch_error=(snapshot.error if snapshot is not None else "no answer yet"),
                    partition=partition)
    else:
        need = max(1, cpus_per_job)
        free = max(0, c.free_cpus - submitted_cpus_since)
        queue = snapshot.queue_length or 0
        slots = max(1, c.total_cpus // need)
        if not c.available or snapshot.impossible:
            wait, source = UNREACHABLE_WAIT, "partition_down" if not c.available else "impossible"
            if snapshot.impossible:
                tags["batch_error"] = snapshot.impossible
        elif snapshot.est_start_known and snapshot.est_start is not None:
            wait = max(0.0, snapshot.est_start - (now - snapshot.taken))
            source = "scheduler"
            tags["est_wait_scheduler"] = wait      # the scheduler's own word, before corrections
        elif free >= need and queue == 0:
            wait, source = 0.0, "idle"
        else:   # coarse model: the pending jobs ahead run in waves of `slots`
            wait, source = math.ceil((queue + 1) / slots) * tcomp, "model"
        if own_running and source in ("scheduler", "model") and queue <= num_pending:
            mine = own_wait(now=now, free_cpus=c.free_cpus - submitted_cpus_since,
                            need=need + own_pending_cpus, running=own_running)
            if mine is not None and mine < wait:
                wait, source = mine, source + "+own"
        if submitted_cpus_since and wait < tcomp and free < need and "+own" not in source:
            # our own new jobs took the CPUs the snapshot saw free
            wait, source = max(wait, tcomp * math.ceil(submitted_cpus_since / (need * slots))), \
                source + "+recent"
        if queued_here:
            wait += math.ceil(queued_here / max(1, max_jobs)) * tcomp
        tags.update(
            batch_available=bool(c.available) and not snapshot.impossible, est_wait_source=source,
            partition=c.partition,
            nb_total_resources=c.total_cpus, nb_free_resources=c.free_cpus,
            nb_total_nodes=c.total_nodes, nb_free_nodes=c.free_nodes,
            free_cpu=(c.free_cpus / c.total_cpus) if c.total_cpus else 0.0, nb_cpu=c.total_cpus,
            max_walltime=c.max_walltime, queue_length=queue,
            estimate_age=max(0.0, now - snapshot.taken))
    tags["est_wait"] = wait
    tags["eft"] = now + wait + tcomp
    tags["slowdown"] = (wait + tcomp) / tcomp
    return tags
