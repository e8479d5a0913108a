"""``gridrpc sim predict``: predict a measured scalability study on a host
profile, run by run and load step by load step, and compare.

For every run of the study (``python -m benchmarks.scalability``, one host,
every element a process on it): the median of 200 sequential discoveries
(one blocking client, k = 3) and, for every load step, the closed loop of
that many users in one load-generator process (``gridrpc loadtest``: a call
with its discovery, the load generator's reuse window of view answers,
``LOADTEST_REUSE``), on the profile's cores and speed. Pushed views are on
unless the study was measured with ``--fanout`` (``meta.discovery_mode``),
as the daemons it measured. A case *holds* when the prediction is within
``tolerance`` (25 %) of the measurement.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from .host import HostProfile
from .model import Costs
from .world import LOADTEST_REUSE, World, closed_loop, discovery_series, elements_for

__all__ = ["TOLERANCE", "cmd_predict", "combine", "format_combined", "format_rows", "predict_study"]

TOLERANCE = 0.25


def _world(profile: HostProfile, costs: Costs, seed: int, views: bool) -> World:
    return World(costs=costs, seed=seed, views=views, **profile.world_kw())


def predict_run(shape: str, n: int, profile: HostProfile, costs: Costs, *, users: list[int], views: bool,
                seeds: int = 1, seconds: float = 1.5, rounds: int = 200,
                reuse: float = LOADTEST_REUSE) -> dict:
    """Discovery median and p99 (seed 1) and calls/s per users (median over ``seeds``)."""
    els = elements_for(shape, n)
    w = _world(profile, costs, 1, views).build(els)
    w.wait_registered()
    d = discovery_series(w, rounds=rounds)
    out = {"discovery_median_ms": d["discovery_median_ms"], "discovery_p99_ms": d["discovery_p99_ms"],
           "view_answers": d["view_answers"], "discoveries": d["discoveries"], "load": {}}
    for u in users:
        rates = []
        for s in range(1, seeds + 1):
            w = _world(profile, costs, s, views).build(els)
            w.wait_registered()
            rates.append(closed_loop(w, u, seconds=seconds, reuse=reuse)["throughput"])
        out["load"][u] = statistics.median(rates)
    return out


def predict_study(study: dict, profile: HostProfile, costs: Costs, *, views: bool | None = None, seeds: int = 1,
                  progress=lambda s: None) -> list[dict]:
    """One row per run and load step: measured and predicted discovery
    median (the same on every step of a run) and calls/s, and the errors."""
    if views is None:
        views = study.get("meta", {}).get("discovery_mode", "view") != "fanout"
    rows = []
    for run in study["runs"]:
        if "error" in run or "discovery" not in run:
            continue
        steps = [s for s in run.get("load", []) if "rps" in s]
        t = time.perf_counter()
        p = predict_run(run["shape"], run["n"], profile, costs, users=[s["users"] for s in steps], views=views,
                        seeds=seeds)
        md = run["discovery"]["median_ms"]
        for s in steps:
            rows.append({"n": run["n"], "shape": run["shape"], "users": s["users"],
                         "measured_median_ms": md, "predicted_median_ms": p["discovery_median_ms"],
                         "median_error": p["discovery_median_ms"] / md - 1,
                         "measured_rps": s["rps"], "predicted_rps": p["load"][s["users"]],
                         "rps_error": p["load"][s["users"]] / s["rps"] - 1 if s["rps"] else None,
                         "view_answers": p["view_answers"], "load_before": run.get("loadavg_before")})
        progress(f"{run['n']} SeDs {run['shape']}: {time.perf_counter() - t:.1f} s")
    return rows


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+.0f}%"


def format_rows(rows: list[dict], tolerance: float = TOLERANCE) -> str:
    lines = [f"{'SeDs':>5s} {'shape':7s} {'users':>5s} {'disc med meas':>13s} {'pred':>6s} {'err':>6s} "
             f"{'calls/s meas':>12s} {'pred':>7s} {'err':>6s}"]
    for r in rows:
        lines.append(f"{r['n']:5d} {r['shape']:7s} {r['users']:5d} {r['measured_median_ms']:13.2f} "
                     f"{r['predicted_median_ms']:6.2f} {_pct(r['median_error']):>6s} {r['measured_rps']:12.0f} "
                     f"{r['predicted_rps']:7.0f} {_pct(r['rps_error']):>6s}")
    runs = {(r["n"], r["shape"]): r for r in rows}
    md_ok = sum(1 for r in runs.values() if abs(r["median_error"]) <= tolerance)
    rps_ok = sum(1 for r in rows if r["rps_error"] is not None and abs(r["rps_error"]) <= tolerance)
    lines.append(f"within {tolerance:.0%}: discovery median {md_ok} of {len(runs)} runs, "
                 f"calls/s {rps_ok} of {len(rows)} load steps")
    return "\n".join(lines)


def combine(studies: list[list[dict]], tolerance: float = TOLERANCE) -> list[dict]:
    """Several measurements of the same runs (``predict_study`` rows of each
    study): per run and load step, the measurements' median and range
    against the prediction (the same for every study: seeded), and whether
    the prediction is within ``tolerance`` of the median and of the range
    widened by it."""
    by: dict[tuple, list[dict]] = {}
    for rows in studies:
        for r in rows:
            by.setdefault((r["n"], r["shape"], r["users"]), []).append(r)
    out = []
    for (n, shape, users), rs in by.items():
        md = [r["measured_median_ms"] for r in rs]
        rps = [r["measured_rps"] for r in rs]
        pmd, prps = rs[0]["predicted_median_ms"], rs[0]["predicted_rps"]
        mmd, mrps = statistics.median(md), statistics.median(rps)
        out.append({"n": n, "shape": shape, "users": users, "measurements": len(rs),
                    "measured_median_ms": mmd, "measured_median_ms_range": [min(md), max(md)],
                    "predicted_median_ms": pmd, "median_error": pmd / mmd - 1,
                    "median_in_range": min(md) * (1 - tolerance) <= pmd <= max(md) * (1 + tolerance),
                    "measured_rps": mrps, "measured_rps_range": [min(rps), max(rps)], "predicted_rps": prps,
                    "rps_error": prps / mrps - 1 if mrps else None,
                    "rps_in_range": min(rps) * (1 - tolerance) <= prps <= max(rps) * (1 + tolerance)})
    return out


def format_combined(rows: list[dict], tolerance: float = TOLERANCE) -> str:
    """A markdown table of :func:`combine`'s rows."""
    lines = ["| shape | users | discovery median measured, ms: median [range] | predicted | error | "
             "calls/s measured: median [range] | predicted | error |", "|---|---:|---|---:|---:|---|---:|---:|"]
    for r in rows:
        lo, hi = r["measured_median_ms_range"]
        rlo, rhi = r["measured_rps_range"]
        lines.append(f"| {r['shape']} | {r['users']} | {r['measured_median_ms']:.2f} [{lo:.2f}-{hi:.2f}] | "
                     f"{r['predicted_median_ms']:.2f} | {_pct(r['median_error'])} | {r['measured_rps']:.0f} "
                     f"[{rlo:.0f}-{rhi:.0f}] | {r['predicted_rps']:.0f} | {_pct(r['rps_error'])} |")
    runs = {(r["n"], r["shape"]): r for r in rows}
    lines.append("")
    lines.append(f"Within {tolerance:.0%} of the measurements' median: discovery "
                 f"{sum(abs(r['median_error']) <= tolerance for r in runs.values())} of {len(runs)} trees, "
                 f"calls/s {sum(r['rps_error'] is not None and abs(r['rps_error']) <= tolerance for r in rows)} "
                 f"of {len(rows)} load steps; within their range widened by {tolerance:.0%}: discovery "
                 f"{sum(r['median_in_range'] for r in runs.values())} of {len(runs)}, calls/s "
                 f"{sum(r['rps_in_range'] for r in rows)} of {len(rows)}.")
    return "\n".join(lines)


def cmd_predict(a) -> int:
    profile = HostProfile.load(a.host_profile) if a.host_profile else HostProfile(cores=2)
    if a.cores is not None or a.speed is not None:
        profile = HostProfile(cores=a.cores or profile.cores, speed=a.speed or profile.speed,
                              bench_s=profile.bench_s, costs=profile.costs, source=profile.source + " (overridden)")
    costs = Costs.load(a.costs or profile.costs)
    t = time.perf_counter()
    out: dict = {"profile": profile.__dict__, "studies": []}
    for path in a.study:
        study = json.loads(Path(path).read_text())
        rows = predict_study(study, profile, costs, views=a.views, seeds=a.seeds,
                             progress=lambda s: print(s, file=sys.stderr, flush=True))
        print(f"{path} ({study.get('meta', {}).get('cpus', '?')} CPUs when measured; predicted on "
              f"{profile.cores} cores, speed {profile.speed:g}):")
        print(format_rows(rows, a.tolerance))
        out["studies"].append({"study": path, "rows": rows})
    if len(out["studies"]) > 1:
        out["combined"] = combine([x["rows"] for x in out["studies"]], a.tolerance)
        print(f"\n{len(out['studies'])} measurements of the same trees:")
        print(format_combined(out["combined"], a.tolerance))
    out["wall_s"] = round(time.perf_counter() - t, 1)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0
