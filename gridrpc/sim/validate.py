"""``gridrpc sim validate``: predict the stored real runs and compare.

For every tree of the scalability study (one 2-core host, every element a
real process): the simulated median of sequential discoveries (one client,
k = 3) and the simulated throughput of the closed-loop load test (``users``
of the measured saturation point, discovery + call of ``noop``; the median
of ``load_seeds`` seeds: with a few users a tree may settle in a batching or
a waking regime, 345-411 calls/s for L2-7 at 8 users over 5 seeds), against
the measured figures. Writes a JSON table and, with matplotlib, a plot.

Several measurements of the same trees (``--study`` given more than once,
:func:`validate_many`): one prediction per tree, compared with each
measurement by :mod:`gridrpc.sim.validate_compare` (the tolerance, the
measured range, the CPU split); plots in :mod:`gridrpc.sim.validate_plot`.
The throughput predicted for a tree is the highest of the simulated closed
loops at the users where the measurements saturated (each the median over
``load_seeds`` seeds).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from .calibrate import STUDY, load_inputs
from .model import Costs
# the comparison and the plots live apart; their names stay importable from here
from .validate_compare import (SMALL_TREE, TOLERANCE, by_kind, compare, cpu_split, cpu_summary,
                               format_many, judge, measurements, saturation_cpu, study_labels, summarise)
from .validate_plot import plot, plot_many
from .world import World, closed_loop, discovery_series, elements_for

__all__ = ["SMALL_TREE", "TOLERANCE", "by_kind", "cmd_validate", "cmd_validate_many", "compare", "cpu_split",
           "cpu_summary", "format_many", "judge", "measurements", "plot", "plot_many", "predict", "predict_load",
           "saturation_cpu", "study_labels", "summarise", "validate", "validate_many"]


def predict(shape: str, n: int, costs: Costs, *, users: int = 8, rounds: int = 200, seconds: float = 1.5,
            seed: int = 1, load_seeds: int = 1) -> dict:
    """Discovery median (``seed``) and closed-loop calls/s (the median over
    seeds ``seed`` .. ``seed + load_seeds - 1``; every one in ``throughputs``)."""
    if load_seeds < 1:
        raise ValueError(f"load_seeds must be >= 1, not {load_seeds}")
    w = World(costs=costs, seed=seed).build(elements_for(shape, n))
    w.wait_registered()
    d = discovery_series(w, rounds=rounds)
    return {"discovery_median_ms": d["discovery_median_ms"], "discovery_p99_ms": d["discovery_p99_ms"],
            **predict_load(shape, n, costs, users=users, seconds=seconds, seed=seed, load_seeds=load_seeds)}


def predict_load(shape: str, n: int, costs: Costs, *, users: int, seconds: float = 1.5, seed: int = 1,
                 load_seeds: int = 1) -> dict:
    """Closed-loop calls/s of ``users``: the median over seeds ``seed`` ..
    ``seed + load_seeds - 1`` (every one in ``throughputs``)."""
    if load_seeds < 1:
        raise ValueError(f"load_seeds must be >= 1, not {load_seeds}")
    loads = []
    for s in range(seed, seed + load_seeds):
        w = World(costs=costs, seed=s).build(elements_for(shape, n))
        w.wait_registered()
        loads.append(closed_loop(w, users, seconds=seconds))
    t = sorted(loads, key=lambda r: r["throughput"])[(len(loads) - 1) // 2]      # the median run
    return {"throughput": t["throughput"], "throughputs": [r["throughput"] for r in loads],
            "busiest": max(t["busy"], key=t["busy"].get), "ma_busy": t["ma_busy"],
            "busy_total": sum(t["busy"].values()), "busy_by_kind": by_kind(t["busy"])}


def validate(study: dict, costs: Costs, *, max_load: float | None = None, load_seeds: int = 3,
             progress=lambda s: None) -> dict:
    rows = []
    for run in study["runs"]:
        load = run.get("loadavg_before") or 0.0
        t = time.perf_counter()
        p = predict(run["shape"], run["n"], costs, users=run["saturation"]["users"], load_seeds=load_seeds)
        md, mt = run["discovery"]["median_ms"], run["saturation"]["max_rps"]
        row = {"n": run["n"], "shape": run["shape"], "load": round(load, 1),
               "measured_median_ms": md, "predicted_median_ms": p["discovery_median_ms"],
               "median_error": p["discovery_median_ms"] / md - 1,
               "measured_rps": mt, "predicted_rps": p["throughput"], "rps_error": p["throughput"] / mt - 1,
               "predicted_rps_seeds": p["throughputs"],
               "users": run["saturation"]["users"], "in_scope": max_load is None or load <= max_load,
               "sim_wall_s": time.perf_counter() - t}
        rows.append(row)
        progress(f"  {run['shape']:6s} {run['n']:4d}: discovery {md:6.2f} ms measured, "
                 f"{row['predicted_median_ms']:6.2f} predicted ({row['median_error']:+.0%}); "
                 f"{mt:6.0f} calls/s measured, {row['predicted_rps']:6.0f} predicted ({row['rps_error']:+.0%})")

    def share(key):
        xs = [abs(r[key]) for r in rows if r["in_scope"]]
        return {"within_15pct": sum(1 for x in xs if x <= 0.15), "of": len(xs),
                "median_abs_error": statistics.median(xs) if xs else None}
    best_measured = {}
    best_predicted = {}
    for r in rows:
        for best, key in ((best_measured, "measured_median_ms"), (best_predicted, "predicted_median_ms")):
            if r["n"] not in best or r[key] < best[r["n"]][1]:
                best[r["n"]] = (r["shape"], r[key])
    return {"rows": rows, "median": share("median_error"), "throughput": share("rps_error"),
            "best_shape": {n: {"measured": best_measured[n][0], "predicted": best_predicted[n][0]}
                           for n in best_measured},
            "costs": costs.source}


def validate_many(studies: list[tuple[str, dict]], costs: Costs, *, max_load: float | None = None,
                  load_seeds: int = 3, progress=lambda s: None) -> dict:
    """One prediction per tree of ``[(label, study), ...]``, compared with
    every measurement of it (:func:`compare`)."""
    trees = measurements(studies, max_load)
    preds = {}
    for (n, shape), ms in trees.items():
        t = time.perf_counter()
        w = World(costs=costs, seed=1).build(elements_for(shape, n))
        w.wait_registered()
        d = discovery_series(w, rounds=200)
        by_users = {}
        busy = {}
        kinds = {}
        seeds = {}
        for users in sorted({m["users"] for m in ms}):
            lp = predict_load(shape, n, costs, users=users, load_seeds=load_seeds)
            by_users[users] = lp["throughput"]
            busy[users] = lp["busy_total"]
            kinds[users] = lp["busy_by_kind"]
            seeds[str(users)] = lp["throughputs"]
        preds[(n, shape)] = {"median_ms": d["discovery_median_ms"], "rps_by_users": by_users,
                             "busy_by_users": busy, "busy_kinds_by_users": kinds, "predicted_rps_seeds": seeds,
                             "sim_wall_s": time.perf_counter() - t}
        progress(f"  {shape:6s} {n:4d}: discovery {d['discovery_median_ms']:6.2f} ms predicted, calls/s "
                 + ", ".join(f"{v:.0f} at {u} users" for u, v in by_users.items()))
    res = compare(trees, preds, [label for label, _ in studies])
    res["costs"] = costs.source
    return res


def cmd_validate(a) -> int:
    files = a.study if isinstance(a.study, list) else [a.study] if a.study else []
    if len(files) > 1:
        return cmd_validate_many(a, files)
    study, _ = load_inputs(files[0] if files else STUDY)
    costs = Costs.load(a.costs)
    res = validate(study, costs, max_load=a.max_load, load_seeds=a.seeds,
                   progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(f"discovery median within 15 %: {res['median']['within_15pct']}/{res['median']['of']} "
          f"(median |error| {res['median']['median_abs_error']:.0%}); throughput within 15 %: "
          f"{res['throughput']['within_15pct']}/{res['throughput']['of']} "
          f"(median |error| {res['throughput']['median_abs_error']:.0%})", file=sys.stderr)
    for n, b in res["best_shape"].items():
        print(f"  {n:4d} SeDs: best discovery measured {b['measured']}, predicted {b['predicted']}", file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    if a.plot:
        plot(res, Path(a.plot))
    return 0


def cmd_validate_many(a, files: list[str]) -> int:
    costs = Costs.load(a.costs)
    labels = study_labels(files)
    studies = [(label, load_inputs(f)[0]) for label, f in zip(labels, files)]
    res = validate_many(studies, costs, max_load=a.max_load, load_seeds=a.seeds,
                        progress=lambda s: print(s, file=sys.stderr, flush=True))
    res["files"] = files
    print(format_many(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    if a.plot:
        plot_many(res, Path(a.plot))
    return 0
