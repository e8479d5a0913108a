"""A simulated batch cluster: FCFS with EASY backfilling (docs/simulation-traces.md).

``nodes x cores`` CPUs, counted for the whole cluster (a job takes any free
CPUs, as Slurm's ``cons_tres`` packing would; node fragmentation is
ignored, as ``estimate.own_wait`` ignores it). Jobs carry the time limit
they asked for (``wall``) and are killed when they reach it.

Scheduling (Mu'alem & Feitelson's EASY): on every submission and job end,
jobs start from the head of the queue while they fit; when the head does not
fit it gets a reservation -- the *shadow time* when enough running jobs
will have ended *by their time limits* -- and later jobs (at most
``bf_depth`` of them, Slurm's ``bf_max_job_test``) may start now if they fit
and either end by their limit before the shadow time or use only the CPUs
the head will not need then.

Start estimate (:meth:`BatchCluster.estimate_start`, what ``sbatch
--test-only`` answers): the way Slurm's backfill computes it, from time
limits only -- running jobs end at start + limit, every pending job (the first
``bf_depth``) is reserved in queue order at its earliest fit in that profile,
and the asked-for job goes at its earliest fit after them. Behind a longer
queue there is no estimate (``None``), as Slurm gives none for jobs its
backfill pass does not reach. The profile is cached until the cluster changes.
"""
from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass

from gridrpc.sed.batch.base import ClusterInfo

__all__ = ["SimJob", "BatchCluster"]


@dataclass(slots=True, eq=False)
class SimJob:
    """A job on a simulated cluster; times in the cluster's seconds."""
    id: int
    submit: float
    cpus: int
    run: float                 # what it needs on this cluster
    wall: float                # its time limit here
    user: str = "u"
    service: str = "job"
    start: float | None = None
    end: float | None = None
    killed: bool = False
    predicted_wait: float | None = None
    predicted_run: float | None = None
    source: str = ""           # est_wait_source of the vector it was chosen on


class BatchCluster:
    """One cluster's scheduler. ``submit``/``finish`` return the jobs that
    started at ``now`` (their ``end`` is set: the caller schedules it)."""

    def __init__(self, name: str, nodes: int, cores: int, *, speed: float = 1.0, price: float = 0.0,
                 max_walltime: float | None = None, bf_depth: int = 100) -> None:
        if nodes < 1 or cores < 1:
            raise ValueError(f"cluster {name}: nodes and cores must be >= 1")
        if not speed > 0 or price < 0 or bf_depth < 1:
            raise ValueError(f"cluster {name}: speed must be > 0, price >= 0, bf_depth >= 1")
        self.name, self.nodes, self.cores = name, nodes, cores
        self.speed, self.price, self.max_walltime, self.bf_depth = speed, price, max_walltime, bf_depth
        self.total = nodes * cores
        self.free = self.total
        self.queue: collections.deque[SimJob] = collections.deque()
        self.pending_cpus = 0
        self.running: set[SimJob] = set()
        self.busy_cpu_seconds = 0.0
        self._profile: tuple[list[float], list[int]] | None = None

    # ----------------------------------------------------------------- state
    def impossible(self, cpus: int, wall: float) -> str | None:
        """Why a job of this shape can never run here (None: it can)."""
        if cpus > self.total:
            return f"{cpus} CPUs asked, the cluster has {self.total}"
        if self.max_walltime is not None and wall > self.max_walltime:
            return f"time limit {wall:g} s over the partition's {self.max_walltime:g} s"
        return None

    def info(self) -> ClusterInfo:
        """What ``sinfo`` would say (free nodes: the free CPUs packed into whole nodes)."""
        return ClusterInfo(partition=self.name, total_cpus=self.total, free_cpus=self.free,
                           total_nodes=self.nodes, free_nodes=self.free // self.cores,
                           max_walltime=self.max_walltime, available=True)

    def submit(self, job: SimJob, now: float) -> list[SimJob]:
        if self.impossible(job.cpus, job.wall):
            raise ValueError(f"cluster {self.name}: job {job.id} cannot run here: "
                             f"{self.impossible(job.cpus, job.wall)}")
        job.submit = now
        self.queue.append(job)
        self.pending_cpus += job.cpus
        self._profile = None
        return self.schedule(now)

    def finish(self, job: SimJob) -> None:
        """``job`` reached its end (call :meth:`schedule` after the ends of one instant)."""
        self.running.discard(job)
        self.free += job.cpus
        self._profile = None

    def _start(self, job: SimJob, now: float) -> SimJob:
        self.free -= job.cpus
        self.pending_cpus -= job.cpus
        job.start = now
        job.killed = job.run > job.wall
        ran = job.wall if job.killed else job.run
        job.end = now + ran
        self.busy_cpu_seconds += ran * job.cpus
        self.running.add(job)
        return job

    # ------------------------------------------------------------ scheduling
    def shadow(self, need: int) -> tuple[float, int]:
        """(time, extra): when ``need`` CPUs will be free if running jobs end
        at their limits, and how many CPUs are free beyond ``need`` then."""
        avail = self.free
        if avail >= need:
            return 0.0, avail - need
        for end, cpus in sorted((j.start + j.wall, j.cpus) for j in self.running):
            avail += cpus
            if avail >= need:
                return end, avail - need
        raise ValueError(f"cluster {self.name}: {need} CPUs can never be free")

    def schedule(self, now: float) -> list[SimJob]:
        """One EASY pass at ``now``; the jobs it started."""
        q = self.queue
        started = []
        while q and q[0].cpus <= self.free:
            started.append(self._start(q.popleft(), now))
        if q and self.free > 0 and len(q) > 1:
            shadow, extra = self.shadow(q[0].cpus)
            i, tested = 1, 0
            while i < len(q) and tested < self.bf_depth and self.free > 0:
                job = q[i]
                tested += 1
                if job.cpus <= self.free and (now + job.wall <= shadow or job.cpus <= extra):
                    if now + job.wall > shadow:
                        extra -= job.cpus
                    del q[i]
                    started.append(self._start(job, now))
                else:
                    i += 1
        if started:
            self._profile = None
        return started

    # ------------------------------------------------------------ estimates
    def estimate_start(self, cpus: int, wall: float, now: float) -> float | None:
        """Seconds from ``now`` until a job of this shape submitted now would
        start, from time limits (None: the queue is longer than ``bf_depth``)."""
        if self.impossible(cpus, wall):
            raise ValueError(self.impossible(cpus, wall))
        if not self.queue and cpus <= self.free:
            return 0.0
        if len(self.queue) > self.bf_depth:
            return None
        if self._profile is None:
            self._profile = self._build_profile(now)
        times, free = self._profile
        i = _fit(times, free, cpus, wall)
        return max(0.0, times[i] - now)

    def _build_profile(self, now: float) -> tuple[list[float], list[int]]:
        """Free CPUs as steps (``free[i]`` from ``times[i]`` on), running jobs
        ending at their limits, every pending job reserved in queue order."""
        times, free = [now], [self.free]
        for end, cpus in sorted((j.start + j.wall, j.cpus) for j in self.running):
            if end <= times[-1]:
                free[-1] += cpus
            else:
                times.append(end)
                free.append(free[-1] + cpus)
        for job in self.queue:
            i = _fit(times, free, job.cpus, job.wall)
            t1 = times[i] + job.wall
            k = bisect.bisect_left(times, t1, i + 1)
            if k == len(times) or times[k] != t1:
                times.insert(k, t1)
                free.insert(k, free[k - 1])
            for m in range(i, k):
                free[m] -= job.cpus
        return times, free


def _fit(times: list[float], free: list[int], need: int, dur: float) -> int:
    """Index of the first step from which ``need`` CPUs stay free for ``dur``
    (the last step, when everything has ended, always fits)."""
    n = len(times)
    i = 0
    while True:
        if free[i] >= need:
            end = times[i] + dur
            k = i + 1
            while k < n and times[k] < end and free[k] >= need:
                k += 1
            if k >= n or times[k] >= end:
                return i
            i = k + 1
        else:
            i += 1
