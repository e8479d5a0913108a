"""Pilot SeDs against a job per call, on a real private Slurm.

``C`` clients (threads, one ``gridrpc.Client`` each) send ``N`` calls of
``sleep(D)`` straight to a batch SeD, one call at a time each:

- **pilots**: a batch SeD with pilot settings (``--max`` pilots of
  ``--cores`` cores): the scheduler starts a few pilot jobs, each a SeD
  serving many calls;
- **job per call**: the plain batch SeD, every call its own Slurm job, on a
  smaller sample (``--per-call-sample`` calls) in the same run.

Printed per mode: calls, failed calls, seconds from the first call to the
last answer, calls/s, batch jobs submitted, and the median call latency.

Run (needs Slurm and munge, ``scripts/install-test-deps``): ``python -m
benchmarks.pilots [--calls 1000 --clients 8 --duration 0.05 --cores 2 --max 4
--per-call-sample 40] [--json out.json]``. The private Slurm (one node
advertising 8 CPUs) lives in a temporary directory removed at the end.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time

import gridrpc
from gridrpc.sed.batch.config import parse_batch_config
from gridrpc.sed.batch.sed import BatchSeD
from gridrpc.testing import LoopThread


def _run(sed, calls: int, clients: int, duration: float) -> dict:
    target = f"{sed.address}#{sed.name}"
    per = [calls // clients + (1 if i < calls % clients else 0) for i in range(clients)]

    def work(n: int) -> tuple[list[float], int]:
        lat, failed = [], 0
        with gridrpc.Client(None, ping_interval=0.3, ping_timeout=5.0) as c:
            for _ in range(n):
                t = time.perf_counter()
                try:
                    c.call("sleep", duration, server=target, timeout=300)
                    lat.append(time.perf_counter() - t)
                except gridrpc.GridRPCError as exc:
                    print(f"  failed: {exc}", file=sys.stderr)
                    failed += 1
        return lat, failed

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(work, per))
    wall = time.perf_counter() - t0
    lat = [x for r in results for x in r[0]]
    return {"calls": calls, "failed": sum(r[1] for r in results), "seconds": round(wall, 2),
            "calls_per_s": round(len(lat) / wall, 1), "median_latency_s": round(statistics.median(lat), 3) if lat else None}


def _sed(cluster, shared: str, name: str, pilot: dict | None) -> BatchSeD:
    data = {"scheduler": "slurm", "shared_dir": shared, "env": cluster.env, "poll_interval": 0.25,
            "estimate_interval": 2.0, "time_limit": 600}
    if pilot is not None:
        data["pilot"] = pilot
    sed = BatchSeD(name, None, config=parse_batch_config(data), hb_interval=0.5, hb_timeout=2.0)
    sed.add_service("sleep", "gridrpc.examples.services:sleep")
    return sed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pilots", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=0.05, help="seconds each call sleeps")
    p.add_argument("--cores", type=int, default=2, help="cores (call slots) per pilot")
    p.add_argument("--max", type=int, default=4, help="max pilots")
    p.add_argument("--per-call-sample", type=int, default=40, help="calls of the job-per-call run (0: skip)")
    p.add_argument("--json", help="write the results here too")
    a = p.parse_args(argv)
    from tests.batch_clusters import SlurmCluster
    from tests.requirements import require
    require("slurm")
    out: dict = {"settings": vars(a)}
    with tempfile.TemporaryDirectory(prefix="bench-pilots-") as tmp, \
            SlurmCluster(f"{tmp}/slurm", name="bp", cpus=8, extra_conf="SlurmdParameters=config_overrides") as cl:
        lt = LoopThread()
        try:
            sed = _sed(cl, f"{tmp}/shared", "bpilot", {"max": a.max, "cores": a.cores, "idle_timeout": 30,
                                                       "host": "127.0.0.1", "walltime": 1800})
            lt.run(sed.start())
            try:
                r = _run(sed, a.calls, a.clients, a.duration)
                st = lt.call(lambda: sed.execution.statistics())
                r["jobs_submitted"] = st["jobs_submitted"]
                r["pilots_started"] = st["pilots"]["started"]
            finally:
                lt.run(sed.aclose(), timeout=120)
            out["pilots"] = r
            if a.per_call_sample > 0:
                sed = _sed(cl, f"{tmp}/shared", "bjobs", None)
                lt.run(sed.start())
                try:
                    r = _run(sed, a.per_call_sample, a.clients, a.duration)
                    r["jobs_submitted"] = lt.call(lambda: sed.execution.batch_stats["submitted"])
                finally:
                    lt.run(sed.aclose(), timeout=120)
                out["job_per_call"] = r
        finally:
            lt.close()
            cl.cancel_all(timeout=30)
    print(f"{'mode':<14}{'calls':>7}{'failed':>8}{'seconds':>9}{'calls/s':>9}{'jobs':>6}{'median s':>10}")
    for mode in ("pilots", "job_per_call"):
        r = out.get(mode)
        if r:
            print(f"{mode:<14}{r['calls']:>7}{r['failed']:>8}{r['seconds']:>9}{r['calls_per_s']:>9}"
                  f"{r['jobs_submitted']:>6}{r['median_latency_s']:>10}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if all(out[m]["failed"] == 0 for m in ("pilots", "job_per_call") if m in out) else 1


if __name__ == "__main__":
    sys.exit(main())
