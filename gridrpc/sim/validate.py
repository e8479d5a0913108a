"""``gridrpc sim validate``: predict the stored real runs and compare.

For every tree of the scalability study (one 2-core host, every element a
real process): the simulated median of sequential discoveries (one client,
k = 3) and the simulated throughput of the closed-loop load test (``users``
of the measured saturation point, discovery + call of ``noop``; the median
of ``load_seeds`` seeds: with a few users a tree may settle in a batching or
a waking regime, 345-411 calls/s for L2-7 at 8 users over 5 seeds), against
the measured figures. Writes a JSON table and, with matplotlib, a plot.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from .calibrate import STUDY, load_inputs
from .model import Costs
from .world import World, closed_loop, discovery_series, elements_for


def predict(shape: str, n: int, costs: Costs, *, users: int = 8, rounds: int = 200, seconds: float = 1.5,
            seed: int = 1, load_seeds: int = 1) -> dict:
    """Discovery median (``seed``) and closed-loop calls/s (the median over
    seeds ``seed`` .. ``seed + load_seeds - 1``; every one in ``throughputs``)."""
    if load_seeds < 1:
        raise ValueError(f"load_seeds must be >= 1, not {load_seeds}")
    w = World(costs=costs, seed=seed).build(elements_for(shape, n))
    w.wait_registered()
    d = discovery_series(w, rounds=rounds)
    loads = []
    for s in range(seed, seed + load_seeds):
        w = World(costs=costs, seed=s).build(elements_for(shape, n))
        w.wait_registered()
        loads.append(closed_loop(w, users, seconds=seconds))
    t = sorted(loads, key=lambda r: r["throughput"])[(len(loads) - 1) // 2]      # the median run
    return {"discovery_median_ms": d["discovery_median_ms"], "discovery_p99_ms": d["discovery_p99_ms"],
            "throughput": t["throughput"], "throughputs": [r["throughput"] for r in loads],
            "busiest": max(t["busy"], key=t["busy"].get), "ma_busy": t["ma_busy"]}


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


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = result["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, (mk, pk, title) in zip(axes, (("measured_median_ms", "predicted_median_ms", "discovery median (ms)"),
                                          ("measured_rps", "predicted_rps", "calls/s at saturation"))):
        xs = [r[mk] for r in rows]
        ys = [r[pk] for r in rows]
        colors = ["tab:blue" if r["shape"] == "flat" else "tab:orange" if r["shape"].startswith("L2") else "tab:red"
                  for r in rows]
        ax.scatter(xs, ys, c=colors, s=18)
        lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.2
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="gray", alpha=0.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {title}")
        ax.set_ylabel(f"simulated {title}")
        ax.set_title(f"{title}: blue flat, orange L2, red L3 (band ±15 %)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return True


def cmd_validate(a) -> int:
    study, _ = load_inputs(a.study or STUDY)
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
