"""``gridrpc sim trace`` and ``gridrpc sim trace-generate`` (docs/simulation-traces.md)."""
from __future__ import annotations

import json
import sys
import time

TRACE_DOC = """Replay a Standard Workload Format trace through simulated batch SeDs.

Every job arrives at its submit time; the batch SeD of each cluster builds
its estimation vector with the real batch_tags/JobHistory; the policy (a
real aggregator, or the random / round_robin baselines) picks the cluster;
the cluster runs it (FCFS + EASY backfilling, killed at its walltime).

  gridrpc sim trace docs/simulation/traces/synthetic-3k.swf
  gridrpc sim trace big.swf --policy least_wait_time --policy random --json out.json
  gridrpc sim trace t.swf --clusters a:64x8:1.0:0.03,b:32x16:1.5:0.08
"""

GEN_DOC = """Write a synthetic SWF trace (model: docs/simulation-traces.md): Poisson arrivals
with a daily cycle, sizes 1 or powers of two, log-uniform run times per
application, user estimates = run time x a per-user factor, Zipf users.
The same arguments give the same file.

  gridrpc sim trace-generate --jobs 3000 --seed 1 docs/simulation/traces/synthetic-3k.swf
"""

ALL_POLICIES = ("least_wait_time", "least_slowdown", "least_cost", "random", "round_robin")


def add_trace_parsers(s) -> None:
    import argparse

    from .swf import MAX_BYTES, MAX_JOBS
    from .trace_replay import DEFAULT_CLUSTERS
    t = s.add_parser("trace", help="replay an SWF job trace through simulated batch SeDs, per policy",
                     description=TRACE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("file", help="an SWF file (plain text)")
    t.add_argument("--clusters", default=DEFAULT_CLUSTERS,
                   help="name:NODESxCORES[:speed[:price_per_cpu_hour[:max_walltime_s]]],... "
                        f"(default {DEFAULT_CLUSTERS})")
    t.add_argument("--policy", action="append",
                   help="an aggregator name (least_wait_time, least_slowdown, least_cost, ...), a JSON "
                        "aggregator spec, random or round_robin; repeatable or comma-separated "
                        f"(default: {', '.join(ALL_POLICIES)})")
    t.add_argument("--seed", type=int, default=1, help="seed of the policies' random choices and tie-breaks")
    t.add_argument("--bf-depth", type=int, default=100,
                   help="pending jobs the backfill and the start estimate look at (Slurm's bf_max_job_test)")
    t.add_argument("--service-key", choices=("app", "none"), default="app",
                   help="the service a job calls: its application number (field 14), or one service for all")
    t.add_argument("--max-jobs", type=int, default=MAX_JOBS, help="refuse traces with more jobs")
    t.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="refuse larger files")
    t.add_argument("--json", help="write every metric to this file")
    g = s.add_parser("trace-generate", help="write a synthetic SWF trace (seeded)",
                     description=GEN_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("output", help="the .swf file to write")
    g.add_argument("--jobs", type=int, required=True)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--procs", type=int, default=544, help="processors the load refers to (MaxProcs)")
    g.add_argument("--load", type=float, default=0.8, help="offered load: CPU demand / (procs x time span)")
    g.add_argument("--users", type=int, default=40)
    g.add_argument("--max-size", type=int, default=64, help="largest job, a power of two")
    g.add_argument("--min-run", type=float, default=10.0, help="shortest typical run time (s)")
    g.add_argument("--max-run", type=float, default=86400.0, help="longest run time (s)")


def _policies(values: list[str] | None) -> list:
    if not values:
        return list(ALL_POLICIES)
    out: list = []
    for v in values:
        v = v.strip()
        if v.startswith("{"):
            spec = json.loads(v)
            if not isinstance(spec, dict):
                raise ValueError(f"bad policy {v[:60]!r}")
            out.append(spec)
        else:
            out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def _fmt(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def print_table(results: list[dict], out=None) -> None:
    out = out if out is not None else sys.stdout      # the stream of the moment (not of import time)
    head = (f"{'policy':<16} {'jobs':>7} {'mean wait s':>12} {'median wait s':>13} {'mean bsld':>10} "
            f"{'cost':>10} {'makespan d':>10} {'|dwait| med s':>13} {'queued':>7} {'|dwait| q s':>11} "
            f"{'|dtcomp|/run':>12} {'wall s':>7}")
    print(head, file=out)
    for r in results:
        if not r["jobs"]:
            print(f"{r['policy']:<16} {0:>7}   (no job ran: {r['rejected']} rejected, {r['skipped']} skipped)", file=out)
            continue
        print(f"{r['policy']:<16} {r['jobs']:>7} {_fmt(r['mean_wait_s']):>12} {_fmt(r['median_wait_s']):>13} "
              f"{_fmt(r['mean_bounded_slowdown'], 2):>10} {_fmt(r['total_cost'], 0):>10} "
              f"{_fmt(r['makespan_s'] / 86400, 1):>10} {_fmt(r['wait_abs_error_median_s']):>13} "
              f"{r['queued']:>7} {_fmt(r['wait_abs_error_median_queued_s']):>11} "
              f"{_fmt(r['tcomp_rel_error_median'], 2):>12} {r['wall_s']:>7.1f}", file=out)
    for r in (r for r in results if r["jobs"]):
        per = ", ".join(f"{n} {c['jobs']} jobs {c['utilisation'] * 100:.0f}%" for n, c in r["clusters"].items())
        print(f"  {r['policy']}: {per}; killed {r['killed']}, rejected {r['rejected']}, skipped {r['skipped']}; "
              f"est_wait sources {r['est_wait_sources']}", file=out)


def cmd_trace(a) -> int:
    from ..core.aggregators import make_aggregator
    from .swf import SWFError, read_swf
    from .trace_replay import BASELINES, parse_clusters, replay
    try:
        clusters = parse_clusters(a.clusters)
        policies = _policies(a.policy)
        for p in policies:      # an unknown name fails before the trace is read
            if p not in BASELINES:
                make_aggregator(p)
        if a.bf_depth < 1:
            raise ValueError("--bf-depth must be >= 1")
        t = time.perf_counter()
        trace = read_swf(a.file, max_bytes=a.max_bytes, max_jobs=a.max_jobs)
        read_s = time.perf_counter() - t
        results = [replay(trace, clusters, p, seed=a.seed, bf_depth=a.bf_depth, service_key=a.service_key)
                   for p in policies]
    except (SWFError, ValueError, OSError) as exc:
        print(f"gridrpc sim trace: {exc}", file=sys.stderr)
        return 2
    print(f"# {a.file}: {len(trace.jobs)} jobs read in {read_s:.1f} s; clusters "
          + ", ".join(f"{c.name} {c.nodes}x{c.cores} speed {c.speed:g} price {c.price:g}/CPU-h" for c in clusters))
    print_table(results)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"file": a.file, "jobs": len(trace.jobs), "clusters": a.clusters, "seed": a.seed,
                       "bf_depth": a.bf_depth, "service_key": a.service_key, "read_s": round(read_s, 2),
                       "results": results}, f, indent=1)
    return 0


def cmd_generate(a) -> int:
    from .swf import write_swf
    from .swf_gen import generate
    command = (f"gridrpc sim trace-generate --jobs {a.jobs} --seed {a.seed} --procs {a.procs} --load {a.load:g} "
               f"--users {a.users} --max-size {a.max_size} --min-run {a.min_run:g} --max-run {a.max_run:g} "
               f"{a.output}")
    try:
        trace = generate(a.jobs, a.seed, procs=a.procs, load=a.load, users=a.users, max_size=a.max_size,
                         min_run=a.min_run, max_run=a.max_run, command=command)
        write_swf(a.output, trace)
    except (ValueError, OSError) as exc:
        print(f"gridrpc sim trace-generate: {exc}", file=sys.stderr)
        return 2
    print(f"{a.output}: {len(trace.jobs)} jobs; {trace.header['Note'][1]}")
    return 0
