"""Replay an SWF trace through simulated batch SeDs and a meta-scheduler
(docs/simulation-traces.md).

Every job of the trace arrives at its submit time. Each cluster has a
:class:`SimBatchSeD` (its own :class:`~gridrpc.sed.batch.estimate.JobHistory`,
Tsafrir's predictor, learning from the jobs *it* ran) that builds the job's
estimation vector with the real :func:`~gridrpc.sed.batch.estimate.batch_tags`
from the cluster's snapshot (free CPUs, pending queue, the Slurm-like start
estimate) plus a ``price`` tag (``price_per_call`` of the predicted run at the
cluster's price per CPU-hour x the job's CPUs). The policy picks the cluster:
a real aggregator (``least_wait_time``, ``least_slowdown``, ``least_cost``,
or any registered one) ranking those vectors, or a baseline that reads no
estimate (``random``, ``round_robin``). The cluster runs the job (EASY,
:mod:`~gridrpc.sim.batch_cluster`).

Times: a job's run time on a cluster is its trace run time / the cluster's
speed, and its time limit the requested time / speed (the meta-scheduler
scales the request, so a job is killed only where the trace says it ran
past its request). Ends at an instant are processed before arrivals at it.
"""
from __future__ import annotations

import heapq
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gridrpc.core.aggregators import make_aggregator
from gridrpc.sed.batch.estimate import ClusterSnapshot, JobHistory, RunRecord, batch_tags
from gridrpc.sed.cloud.provider_api import price_per_call

from .batch_cluster import BatchCluster, SimJob
from .swf import Trace

__all__ = ["ClusterSpec", "parse_clusters", "DEFAULT_CLUSTERS", "BASELINES", "SimBatchSeD", "replay", "TAU"]

#: bounded slowdown threshold (s): max(1, (wait + run) / max(run, TAU))
TAU = 10.0
BASELINES = ("random", "round_robin")
#: 544 CPUs in four clusters of different sizes, speeds and prices per CPU-hour
DEFAULT_CLUSTERS = "alpha:32x8:1.0:0.03,beta:16x8:1.4:0.06,gamma:24x4:0.8:0.02,delta:8x8:1.2:0.045"


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: int
    cores: int
    speed: float = 1.0
    price: float = 0.0                  # per CPU-hour
    max_walltime: float | None = None   # seconds; None = unlimited


def parse_clusters(text: str) -> list[ClusterSpec]:
    """``name:NODESxCORES[:speed[:price[:max_walltime_s]]]``, comma-separated."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) < 2 or len(parts) > 5 or not parts[0]:
                raise ValueError
            nodes, cores = (int(x) for x in parts[1].lower().split("x"))
            speed = float(parts[2]) if len(parts) > 2 else 1.0
            price = float(parts[3]) if len(parts) > 3 else 0.0
            wall = float(parts[4]) if len(parts) > 4 else None
        except ValueError:
            raise ValueError(f"bad cluster {item.strip()[:60]!r}: name:NODESxCORES[:speed[:price_per_cpu_hour"
                             f"[:max_walltime_s]]], e.g. alpha:32x8:1.0:0.03") from None
        if nodes < 1 or cores < 1 or not speed > 0 or not price >= 0 or not math.isfinite(speed + price) \
                or (wall is not None and not wall > 0):
            raise ValueError(f"bad cluster {item.strip()[:60]!r}: nodes, cores, speed, max walltime > 0, price >= 0")
        out.append(ClusterSpec(parts[0], nodes, cores, speed, price, wall))
    if len({c.name for c in out}) != len(out):
        raise ValueError("cluster names must be distinct")
    return out


class SimBatchSeD:
    """The batch SeD of one simulated cluster: what
    ``ClusterViewMixin.estimate`` does (predicted ends of its running jobs,
    its pending jobs, the snapshot), for the job's own shape, on a snapshot
    taken now (the real SeD's is up to ``estimate_interval`` old)."""

    def __init__(self, cluster: BatchCluster, *, max_jobs: int = 1000) -> None:
        self.cluster, self.max_jobs = cluster, max_jobs
        self.history = JobHistory()
        self.last_solve: float | None = None

    def snapshot(self, cpus: int, wall: float, now: float) -> ClusterSnapshot:
        c = self.cluster
        impossible = c.impossible(cpus, wall)
        est = None if impossible else c.estimate_start(cpus, wall, now)
        return ClusterSnapshot(taken=now, cluster=c.info(), queue_length=len(c.queue), est_start=est,
                               est_start_known=est is not None, impossible=impossible)

    def vector(self, *, service: str, user: str, cpus: int, wall: float, now: float) -> dict:
        c, hist = self.cluster, self.history
        tcomp, source = hist.predict(service, user, wall)
        own_running = []
        for j in c.running:      # as ClusterViewMixin.estimate: past due -> another predicted run, within the limit
            run, _ = hist.predict(j.service, j.user, j.wall)
            end = j.start + run
            if end < now:
                end = min(now + run, j.start + j.wall)
            own_running.append((end, j.cpus))
        before = c.pending_cpus            # pending CPUs submitted before the snapshot (taken now)
        for j in reversed(c.queue):
            if j.submit < now:
                break
            before -= j.cpus
        tags = batch_tags(
            now=now, snapshot=self.snapshot(cpus, wall, now), tcomp=tcomp, tcomp_source=source,
            cpus_per_job=cpus, walltime=wall, num_pending=len(c.queue), num_running=len(c.running),
            own_running=own_running, own_pending_cpus=before, queued_here=0, submitted_cpus_since=0,
            max_jobs=self.max_jobs, last_solve=self.last_solve, scheduler="sim-easy", partition=c.name)
        tags["price"] = price_per_call(tags["tcomp"], cpus * c.price)
        return tags

    def observe(self, job: SimJob) -> None:
        self.history.observe(RunRecord(service=job.service, user=job.user, run=job.end - job.start,
                                       wait=job.start - job.submit, walltime=job.wall, nodes=None, time=job.end))


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def replay(trace: Trace, clusters: list[ClusterSpec], policy: str | dict, *, seed: int = 1,
           bf_depth: int = 100, service_key: str = "app",
           on_choice: Callable[[SimJob, list, tuple, str], None] | None = None,
           jobs_out: list | None = None) -> dict:
    """Replay ``trace`` under ``policy``; the metrics (see the module doc).
    ``on_choice(job, servers, rng_state_before_ranking, chosen_name)`` is
    called for every job an aggregator placed; ``jobs_out`` receives
    ``(cluster name, SimJob)`` of every finished job (tests)."""
    t0 = time.perf_counter()
    name = policy if isinstance(policy, str) else policy.get("name", "?")
    agg = None if policy in BASELINES else make_aggregator(policy)
    if service_key not in ("app", "none"):
        raise ValueError("service_key must be 'app' or 'none'")
    rng = random.Random(seed)
    cl = [BatchCluster(s.name, s.nodes, s.cores, speed=s.speed, price=s.price, max_walltime=s.max_walltime,
                       bf_depth=bf_depth) for s in clusters]
    seds = [SimBatchSeD(c) for c in cl]
    heap: list = []
    seq = 0
    done: list[tuple[int, SimJob]] = []
    skipped = rejected = 0
    rr = 0

    def push(ci: int, started: list[SimJob]) -> None:
        nonlocal seq
        for j in started:
            seq += 1
            heapq.heappush(heap, (j.end, seq, ci, j))

    def ends_until(t: float) -> None:
        while heap and heap[0][0] <= t:
            at = heap[0][0]
            touched = set()
            while heap and heap[0][0] == at:
                _, _, ci, j = heapq.heappop(heap)
                cl[ci].finish(j)
                seds[ci].observe(j)
                done.append((ci, j))
                touched.add(ci)
            for ci in sorted(touched):
                push(ci, cl[ci].schedule(at))

    for tj in trace.jobs:
        size = tj.size
        if size <= 0 or tj.run < 0:
            skipped += 1
            continue
        now = float(tj.submit)
        ends_until(now)
        req = tj.req_time if tj.req_time > 0 else max(tj.run, 1)
        service = f"app{tj.app}" if service_key == "app" and tj.app >= 0 else "job"
        user = str(tj.user)
        shape = [(ci, tj.run / c.speed, max(req / c.speed, 1.0)) for ci, c in enumerate(cl)]
        eligible = [(ci, run, wall) for ci, run, wall in shape if cl[ci].impossible(size, wall) is None]
        if not eligible:
            rejected += 1
            continue
        vec = None
        if agg is not None:
            servers = [{"name": cl[ci].name, "address": cl[ci].name,
                        "estimation": seds[ci].vector(service=service, user=user, cpus=size, wall=wall, now=now)}
                       for ci, _, wall in eligible]
            state = rng.getstate() if on_choice is not None else None
            ranked = agg.rank(servers, rng)
            if not ranked:                 # e.g. least_cost's max_cost left none: NoServerAvailable
                rejected += 1
                continue
            best = ranked[0]
            k = next(i for i, s in enumerate(servers) if s is best)
            ci, run, wall = eligible[k]
            vec = best["estimation"]
        else:
            if policy == "random":
                ci, run, wall = rng.choice(eligible)
            else:
                n = len(cl)
                ok = {e[0]: e for e in eligible}
                while rr % n not in ok:
                    rr += 1
                ci, run, wall = ok[rr % n]
                rr += 1
            vec = seds[ci].vector(service=service, user=user, cpus=size, wall=wall, now=now)
        job = SimJob(id=tj.job, submit=now, cpus=size, run=run, wall=wall, user=user, service=service,
                     predicted_wait=vec["est_wait"], predicted_run=vec["tcomp"], source=vec["est_wait_source"])
        if on_choice is not None and agg is not None:
            on_choice(job, servers, state, cl[ci].name)
        seds[ci].last_solve = now
        push(ci, cl[ci].submit(job, now))
    ends_until(math.inf)
    if jobs_out is not None:
        jobs_out.extend((cl[ci].name, j) for ci, j in done)
    out = metrics(done, cl, name)
    out.update(skipped=skipped, rejected=rejected, wall_s=round(time.perf_counter() - t0, 2))
    return out


def metrics(done: list[tuple[int, SimJob]], cl: list[BatchCluster], policy: str) -> dict:
    """Per policy: waits, bounded slowdown, cost, makespan, utilisation, estimate accuracy."""
    if not done:
        return {"policy": policy, "jobs": 0}
    waits = [j.start - j.submit for _, j in done]
    runs = [j.end - j.start for _, j in done]
    bsld = [max(1.0, (w + r) / max(r, TAU)) for w, r in zip(waits, runs)]
    first = min(j.submit for _, j in done)
    makespan = max(j.end for _, j in done) - first
    cost = Counter()
    jobs = Counter()
    for ci, j in done:
        cost[cl[ci].name] += price_per_call(j.end - j.start, j.cpus * cl[ci].price)
        jobs[cl[ci].name] += 1
    wait_err = [abs(j.predicted_wait - w) for (_, j), w in zip(done, waits) if j.predicted_wait is not None]
    by_source: dict[str, list[float]] = {}
    for (_, j), w in zip(done, waits):
        if j.predicted_wait is not None and (w > 0 or j.predicted_wait > 0):
            by_source.setdefault(j.source, []).append(abs(j.predicted_wait - w))
    queued_err = [e for errs in by_source.values() for e in errs]
    run_err = [abs(j.predicted_run - r) / r for (_, j), r in zip(done, runs) if j.predicted_run is not None and r > 0]
    return {
        "policy": policy, "jobs": len(done), "killed": sum(1 for _, j in done if j.killed),
        "mean_wait_s": statistics.fmean(waits), "median_wait_s": statistics.median(waits),
        "mean_bounded_slowdown": statistics.fmean(bsld), "total_cost": sum(cost.values()),
        "makespan_s": makespan,
        "clusters": {c.name: {"jobs": jobs[c.name], "cost": cost[c.name],
                              "utilisation": c.busy_cpu_seconds / (c.total * makespan) if makespan > 0 else 0.0}
                     for c in cl},
        "wait_abs_error_median_s": _median(wait_err), "queued": len(queued_err),
        "wait_abs_error_median_queued_s": _median(queued_err), "tcomp_rel_error_median": _median(run_err),
        "est_wait_sources": dict(Counter(j.source for _, j in done).most_common()),
        "wait_abs_error_median_queued_by_source_s": {k: [len(v), _median(v)] for k, v in sorted(by_source.items())},
    }
