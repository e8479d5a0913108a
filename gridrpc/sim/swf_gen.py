"""A synthetic SWF workload (docs/simulation-traces.md, "The synthetic model").

Deterministic for a seed. The model, simple and stated in full:

- **Users**: ``users`` users; a job's user is drawn with weight 1/rank
  (Zipf, s = 1: a few heavy users, a long tail). Group = 1 + (user-1) mod 5.
- **Applications**: each user has 1-4 applications (SWF field 14, numbered
  across users). An application has a size -- 1 processor with
  probability 0.25, else a power of two 2..``max_size`` (exponent uniform)
  -- and a typical run time, **log-uniform** in [``min_run``, ``max_run``].
  A job repeats its user's previous application with probability 0.7
  (sessions), else takes one of the user's applications at random.
- **Run time** of a job: its application's typical time x e^N(0, 0.4),
  clipped to [1 s, ``max_run``].
- **User estimate** (requested time): run time x the user's
  over-estimation factor (log-uniform in [1.2, 8], drawn once per user) x
  U(0.8, 1.25), rounded up to a whole minute. A share ``under`` (3 %) of
  the jobs of 2 min or more are *under*-estimated: requested time =
  run x U(0.5, 0.9) rounded down to a minute; their SWF run time is the
  demand, larger than the request, so a simulated cluster kills them at
  their walltime (status 0 in the file).
- **Arrivals**: a Poisson process whose rate follows a daily cycle,
  r(t) = 1 + 0.5 cos(2 pi (hour - 14) / 24) (peak at 14:00, trough at
  02:00, 3:1); each gap is exponential with mean g / r(t), where
  g = mean(size x run) / (``load`` x ``procs``): the offered load is
  ``load`` of ``procs`` processors (the file's header says the realised one).
"""
from __future__ import annotations

import math
import random

from .swf import SWFJob, Trace

__all__ = ["generate"]


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def generate(jobs: int, seed: int, *, procs: int = 544, load: float = 0.8, users: int = 40,
             max_size: int = 64, min_run: float = 10.0, max_run: float = 24 * 3600.0,
             under: float = 0.03, command: str | None = None) -> Trace:
    """A :class:`~gridrpc.sim.swf.Trace` of ``jobs`` jobs (see the module doc)."""
    if jobs < 1 or users < 1 or procs < 1:
        raise ValueError("jobs, users and procs must be >= 1")
    if not 0 < load <= 10:
        raise ValueError(f"load must be in (0, 10], not {load}")
    if max_size < 1 or max_size > procs or max_size & (max_size - 1):
        raise ValueError(f"max_size must be a power of two in [1, procs={procs}], not {max_size}")
    if not 1 <= min_run < max_run:
        raise ValueError("need 1 <= min_run < max_run")
    if not 0 <= under < 1:
        raise ValueError("under must be in [0, 1)")
    rng = random.Random(seed)
    top = int(math.log2(max_size))
    cum, acc = [], 0.0
    for u in range(1, users + 1):
        acc += 1.0 / u
        cum.append(acc)
    factor = [_log_uniform(rng, 1.2, 8.0) for _ in range(users)]
    apps: list[list[tuple[int, int, float]]] = []      # per user: (app number, size, typical run)
    n_app = 0
    for _ in range(users):
        mine = []
        for _ in range(rng.randint(1, 4)):
            n_app += 1
            size = 1 if top == 0 or rng.random() < 0.25 else 2 ** rng.randint(1, top)
            mine.append((n_app, size, _log_uniform(rng, min_run, max_run)))
        apps.append(mine)
    last_app: list[tuple[int, int, float] | None] = [None] * users
    shapes = []
    for _ in range(jobs):
        u = rng.choices(range(users), cum_weights=cum)[0]
        app = last_app[u]
        if app is None or rng.random() >= 0.7:
            app = rng.choice(apps[u])
        last_app[u] = app
        number, size, typical = app
        run = int(round(min(max(typical * math.exp(rng.gauss(0.0, 0.4)), 1.0), max_run)))
        if run >= 120 and rng.random() < under:
            req, status = max(60, int(run * rng.uniform(0.5, 0.9)) // 60 * 60), 0
        else:
            req = math.ceil(run * factor[u] * rng.uniform(0.8, 1.25) / 60.0) * 60
            req, status = max(req, math.ceil(run / 60.0) * 60), 1
        shapes.append((u + 1, number, size, run, req, status))
    work = sum(size * min(run, req) for _, _, size, run, req, _ in shapes)
    gap = work / len(shapes) / (load * procs)
    t = 0.0
    out = []
    for i, (user, number, size, run, req, status) in enumerate(shapes):
        if i:
            hour = (t / 3600.0) % 24.0
            t += rng.expovariate(1.0) * gap / (1.0 + 0.5 * math.cos(2 * math.pi * (hour - 14.0) / 24.0))
        out.append(SWFJob(job=i + 1, submit=int(t), wait=-1, run=run, procs=size, cpu_avg=-1, mem_used=-1,
                          req_procs=size, req_time=req, req_mem=-1, status=status, user=user,
                          group=1 + (user - 1) % 5, app=number, queue=1, partition=1, prev_job=-1, think=-1))
    span = max(1, out[-1].submit - out[0].submit)
    trace = Trace(jobs=out)
    trace.header.update({
        "Version": "2.2", "Computer": "gridrpc synthetic workload (gridrpc/sim/swf_gen.py)",
        "MaxJobs": jobs, "MaxRecords": jobs, "MaxProcs": procs, "MaxRuntime": max(j.run for j in out),
        "Note": [f"generated by: {command}" if command else
                 f"generate(jobs={jobs}, seed={seed}, procs={procs}, load={load}, users={users}, "
                 f"max_size={max_size}, min_run={min_run:g}, max_run={max_run:g}, under={under:g})",
                 f"offered load {work / (procs * span):.3f} of {procs} processors over {span} s "
                 f"(target {load:g}); run time = demand, {sum(1 for j in out if j.status == 0)} jobs "
                 "under-estimated (status 0: killed at their walltime in a replay)"],
    })
    return trace
