"""Validate the simulated ethic runs against the stored real ones.

``python -m gridrpc.experiments.sim_validate docs/experiments/data --json v.json --markdown v.md [--plot v.png]``

For every stored point (``data/*.json``: one configuration of ``gridrpc
experiment ethic`` on a real tree, usually 3 runs with seeds 0, 1, 2),
simulate the same configuration with the same seeds, once with the
calibrated overheads and once with none, and say for each metric (unhappy
users, unfairness, completed, killed) whether the simulated median lies in
the real runs' min–max spread. Also compares the client and SeD processes'
CPU and the realised arrival spread (first to last ``user_arrive``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .ethic import EthicConfig
from .overheads import Overheads
from .sim_run import simulate_once

__all__ = ["METRICS", "CLIENT_OF_POINT", "client_of", "validate_point", "validate", "fit_client_start",
           "measure_sched", "scenario_markdown", "main"]

METRICS = ("unhappy_users", "unfairness", "completed", "killed")


def config_of(stored: dict) -> EthicConfig:
    names = {f.name for f in dataclasses.fields(EthicConfig)}
    return EthicConfig(**{k: v for k, v in stored["config"].items() if k in names})


def _arrival_spread(run: dict) -> float:
    t0 = [u["t0"] for u in run.get("user_details", [])]
    return (max(t0) - min(t0)) if t0 else 0.0


def _summary(runs: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in METRICS:
        vals = [r[k] for r in runs]
        out[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    out["arrival_spread"] = statistics.median(_arrival_spread(r) for r in runs)
    cpu = [r.get("cpu_percent") or {} for r in runs]
    for k in ("clients", "sed_processes"):
        vals = [c[k] for c in cpu if k in c]
        out[f"cpu_{k}"] = statistics.median(vals) if vals else None
    return out


def start_delays(stored: dict) -> list[list[float]]:
    """Per run, each user's realised minus planned arrival (s)."""
    cfg = config_of(stored)
    out = []
    for r in stored["runs"]:
        plans = {p.user: p for p in cfg.plans(r["seed"])}
        out.append([u["t0"] - plans[u["user"].split("-", 1)[1]].t0 for u in r.get("user_details", [])])
    return out


def fit_client_start(data_dir: str) -> dict[str, float]:
    """The client start-up of one user: the median over the stored day-scenario runs of the first
    user's start delay (nobody else is starting then), less what the simulation gives for it
    without a start-up cost (the discovery of the run's SeDs with the calibrated costs)."""
    firsts, modelled = [], []
    base = dataclasses.replace(Overheads.from_costs(), client_start=0.0)
    for path in sorted(Path(data_dir).glob("*.json")):
        stored = json.loads(path.read_text())
        if not stored.get("config", {}).get("scenario", "").startswith("day-") or stored.get("simulated"):
            continue
        cfg = config_of(stored)
        for r, delays in zip(stored["runs"], start_delays(stored)):
            if not delays:
                continue
            firsts.append(min(delays))
            sim = simulate_once(dataclasses.replace(cfg, runs=1), r["run"], r["seed"], base)
            modelled.append(min(u["t0"] for u in sim["user_details"])
                            - min(p.t0 for p in cfg.plans(r["seed"])))
    if not firsts:
        raise ValueError(f"no stored day-scenario runs in {data_dir}")
    med, mod = statistics.median(firsts), statistics.median(modelled)
    return {"runs": len(firsts), "first_user_delay_median": med, "modelled_discovery": mod,
            "client_start": max(0.0, med - mod)}


def measure_sched(sizes: tuple[int, ...] = (10, 100, 1000), events: int = 20000) -> dict[str, float]:
    """CPU per queued request per event of the real ethic scheduler: a queue of ``n`` users' optional
    requests, each event one running request finishing and its user submitting the next; the slope
    of the least-squares line of CPU per event against ``n``."""
    import random as _random
    from ..core.queue import Request, SedScheduler, make_policy
    out: dict[str, float] = {}
    for acc in ("cumulative", "virtual"):
        pts = []
        for n in sizes:
            s = SedScheduler(make_policy("ethic", accounting=acc), rng=_random.Random(0))
            for i in range(n):
                s.submit(Request(id=f"u{i}/o0", user=f"u{i}", service="x", optional=True), 0.0)
            reps = max(20, events // n)
            c0 = time.process_time()
            for k in range(reps):
                rid = next(iter(s.running))
                u = s.requests[rid].user
                s.finished(rid, k + 1.0)
                s.submit(Request(id=f"{u}/o{k + 1}", user=u, service="x", optional=True, submitted=k + 1.0), k + 1.0)
            pts.append((n, (time.process_time() - c0) / reps / 2))
        mx = statistics.mean(n for n, _ in pts)
        my = statistics.mean(c for _, c in pts)
        out[acc] = sum((n - mx) * (c - my) for n, c in pts) / sum((n - mx) ** 2 for n, _ in pts)
        out[f"{acc}_points_us"] = {n: round(c * 1e6, 1) for n, c in pts}
    return out


def within(value: float, lo: float, hi: float, rel: float = 1e-9) -> bool:
    return lo - abs(lo) * rel - 1e-12 <= value <= hi + abs(hi) * rel + 1e-12


#: the client each stored point was measured with (by the file name's first part): the runtime's
#: client batches a loop iteration's CALLs and CANCELs per server (and the SeD pauses its queues for a
#: read) from a1e7193 (2026-11-24 01:14 UTC) on; the runner starts the users' clients before the run
#: and users arriving together share one discovery from e06243e (07:15) on, and the client sends a
#: user's mandatory calls first, in their own batch, from 8f0ecdf (07:22) on. The other points
#: (2026-11-22) were measured with one message per call.
CLIENT_OF_POINT = {"scale-burst": {"batches": True, "mandatory_first": False, "shared_discovery": False},
                   "scale-heldack": {"batches": True, "mandatory_first": False, "shared_discovery": False},
                   **{name: {"batches": True, "mandatory_first": True, "shared_discovery": True}
                      for name in ("scale-mandfirst", "scale-final", "scale-ninth", "scale-tenth", "scale-eleventh",
                                   "scale-twelfth")}}
PER_CALL_CLIENT = {"batches": False, "mandatory_first": False, "shared_discovery": False}
TODAYS_CLIENT = {"batches": True, "mandatory_first": True, "shared_discovery": True}


def client_of(point: str) -> dict[str, bool]:
    """The simulated client's behaviour for a stored point (``mandatory_first``, ``batches``,
    ``shared_discovery``)."""
    return CLIENT_OF_POINT.get(point.split(".", 1)[0], PER_CALL_CLIENT)


def validate_point(stored: dict, *, overheads: dict[str, Overheads],
                   client: dict[str, bool] | None = None) -> dict[str, Any]:
    cfg = config_of(stored)
    real = stored["runs"]
    if client is None:          # a stored simulation says which client it simulated; else today's
        client = PER_CALL_CLIENT if stored["config"].get("per_call_client") else TODAYS_CLIENT
    client = dict(client)
    out: dict[str, Any] = {"config": stored["config"], "real": _summary(real), "seeds": [r["seed"] for r in real],
                           "client": client}
    for label, o in overheads.items():
        t0 = time.perf_counter()
        sims = [simulate_once(dataclasses.replace(cfg, runs=1), r["run"], r["seed"], o, **client) for r in real]
        s = _summary(sims)
        s["sim_wall"] = time.perf_counter() - t0
        s["within"] = {k: within(s[k]["median"], out["real"][k]["min"], out["real"][k]["max"]) for k in METRICS}
        s["per_run"] = [{k: r[k] for k in (*METRICS, "seed")} for r in sims]
        out[label] = s
    return out


def point_name(path: Path, stored: dict) -> str:
    return path.stem


def validate(data_dir: str, *, only: str | None = None, progress=print,
             overheads: dict[str, Overheads] | None = None) -> list[dict]:
    overheads = overheads or {"calibrated": Overheads.from_costs(), "zero": Overheads.zero()}
    rows = []
    for path in sorted(Path(data_dir).glob("*.json")):
        if only and only not in path.stem:
            continue
        stored = json.loads(path.read_text())
        if "runs" not in stored or "config" not in stored or stored.get("simulated"):
            continue
        name = point_name(path, stored)
        row = validate_point(stored, overheads=overheads, client=client_of(name))
        row["point"] = name
        rows.append(row)
        c = row["calibrated"] if "calibrated" in row else row[next(iter(overheads))]
        progress(f"{row['point']:45s} " + " ".join(
            f"{k}={c[k]['median']:.3g}{'' if c['within'][k] else '*'}" for k in METRICS)
            + f" ({c['sim_wall']:.1f}s)")
    return rows


def _fmt(v: float, k: str) -> str:
    return f"{v:.3f}" if k == "unfairness" else f"{v:g}"


def markdown(rows: list[dict], label: str = "calibrated") -> str:
    lines = ["| point | unhappy real / sim | unfairness real (min–max) / sim | completed real (min–max) / sim "
             "| killed real (min–max) / sim | in spread |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        r, s = row["real"], row[label]
        cells = []
        for k in METRICS:
            rr = r[k]
            mark = "" if s["within"][k] else " ✗"
            if k == "unhappy_users":
                cells.append(f"{_fmt(rr['median'], k)} / {_fmt(s[k]['median'], k)}{mark}")
            else:
                cells.append(f"{_fmt(rr['median'], k)} ({_fmt(rr['min'], k)}–{_fmt(rr['max'], k)}) / "
                             f"{_fmt(s[k]['median'], k)}{mark}")
        n_in = sum(s["within"].values())
        lines.append(f"| {row['point']} | " + " | ".join(cells) + f" | {n_in}/4 |")
    return "\n".join(lines)


SCENARIOS = ("night-simultaneous", "night-consecutive", "day-regular", "day-diurnal", "day-diurnal-random")
#: the points of the per-scenario table: both ethic rules, and legacy at the paper's ideal n_submit of the
#: night (100) and its best of day-regular (190)
TABLE_POINTS = ("ethic-cumulative", "ethic-virtual", "legacy-100", "legacy-190")


def scenario_markdown(rows: list[dict], label: str = "calibrated", scale: str = "scale-twelfth") -> str:
    """Predicted against measured for the five scenarios of the paper (the
    points of :data:`TABLE_POINTS`) and the 138-SeD scale run ``scale``:
    unhappy users, unfairness and completed requests, the measured median
    with the real runs' min–max, the simulated median of the same seeds."""
    by = {r["point"]: r for r in rows}
    lines = ["| scenario | point | unhappy, measured / predicted | unfairness, measured (min–max) / predicted "
             "| completed, measured (min–max) / predicted |", "|---|---|---|---|---|"]
    names = [(sc, f"{sc}.{p}") for sc in SCENARIOS for p in TABLE_POINTS]
    names += [("138 SeDs, 100 users", f"{scale}.ethic-cumulative"), ("138 SeDs, 100 users", f"{scale}.ethic-virtual")]
    for sc, name in names:
        row = by.get(name)
        if row is None:
            continue
        r, s = row["real"], row[label]
        cells = []
        for k in ("unhappy_users", "unfairness", "completed"):
            mark = "" if s["within"][k] else " ✗"
            if k == "unhappy_users":
                cells.append(f"{_fmt(r[k]['median'], k)} / {_fmt(s[k]['median'], k)}{mark}")
            else:
                cells.append(f"{_fmt(r[k]['median'], k)} ({_fmt(r[k]['min'], k)}–{_fmt(r[k]['max'], k)}) / "
                             f"{_fmt(s[k]['median'], k)}{mark}")
        lines.append(f"| {sc} | {name.split('.', 1)[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def counts(rows: list[dict], label: str) -> dict[str, int]:
    return {k: sum(1 for r in rows if r[label]["within"][k]) for k in METRICS} | {"points": len(rows)}


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    for ax, k, log in zip(axes, ("unfairness", "completed", "killed"), (True, True, True)):
        for label, marker, color in (("calibrated", "o", "tab:red"), ("zero", "x", "tab:gray")):
            xs = [r["real"][k]["median"] for r in rows]
            lo = [r["real"][k]["median"] - r["real"][k]["min"] for r in rows]
            hi = [r["real"][k]["max"] - r["real"][k]["median"] for r in rows]
            ys = [r[label][k]["median"] for r in rows]
            if label == "calibrated":
                ax.errorbar(xs, ys, xerr=[lo, hi], fmt=marker, color=color, ms=4, elinewidth=0.6,
                            label=f"simulated, {label} overheads (bars: real min–max)")
            else:
                ax.plot(xs, ys, marker, color=color, ms=4, label="simulated, zero overheads")
        vals = [v for r in rows for v in (r["real"][k]["min"], r["real"][k]["max"], r["calibrated"][k]["median"])]
        pos = [v for v in vals if v > 0]
        lo_, hi_ = (min(pos) / 2 if pos else 1e-3), (max(vals) * 2 if vals else 1)
        ax.plot([lo_, hi_], [lo_, hi_], "k--", lw=0.7)
        if log:
            ax.set_xscale("symlog", linthresh=0.01 if k == "unfairness" else 1)
            ax.set_yscale("symlog", linthresh=0.01 if k == "unfairness" else 1)
        ax.set_xlabel(f"{k}, real tree (median)")
        ax.set_ylabel(f"{k}, simulated (median)")
        ax.set_title(k)
    axes[0].legend(fontsize=7)
    fig.suptitle("ethic scenarios: simulated vs real (every stored point, same configuration and seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gridrpc.experiments.sim_validate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="directory of stored `gridrpc experiment ethic` JSON files")
    ap.add_argument("--only", default=None, help="only the points whose file name contains this")
    ap.add_argument("--json", default=None, help="write the comparison here")
    ap.add_argument("--markdown", default=None, help="write the table here")
    ap.add_argument("--plot", default=None, help="write a PNG here")
    ap.add_argument("--scenarios", default=None,
                    help="write the per-scenario table (predicted vs measured) here, as markdown")
    ap.add_argument("--from-json", default=None,
                    help="read the comparison from this --json file instead of simulating (tables, counts, plot)")
    ap.add_argument("--fit-start", action="store_true", help="only fit the client start-up cost and print it")
    ap.add_argument("--measure-sched", action="store_true",
                    help="only measure the ethic scheduler's CPU per queued request and print it")
    ap.add_argument("--overhead-factor", type=float, default=1.0,
                    help="multiply the calibrated overheads by this (sensitivity to the host's load)")
    a = ap.parse_args(argv)
    if a.measure_sched:
        print(json.dumps(measure_sched(), indent=1))
        return 0
    if not Path(a.data).is_dir():
        print(f"sim_validate: not a directory: {a.data}", file=sys.stderr)
        return 2
    if a.fit_start:
        print(json.dumps(fit_client_start(a.data), indent=1))
        return 0
    t0 = time.perf_counter()
    overheads = {"calibrated": Overheads.from_costs().scaled(a.overhead_factor), "zero": Overheads.zero()}
    if a.from_json:
        rows = json.loads(Path(a.from_json).read_text())
    else:
        rows = validate(a.data, only=a.only, progress=lambda s: print(s, file=sys.stderr), overheads=overheads)
    if not rows:
        print(f"sim_validate: no stored runs in {a.data}", file=sys.stderr)
        return 2
    for label in ("calibrated", "zero"):
        print(f"{label}: within the real min–max: {counts(rows, label)}")
    print(f"wall {time.perf_counter() - t0:.1f}s")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if a.markdown:
        Path(a.markdown).write_text(markdown(rows) + "\n")
    if a.scenarios:
        Path(a.scenarios).write_text(scenario_markdown(rows) + "\n")
    if a.plot:
        plot(rows, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
