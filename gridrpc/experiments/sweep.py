"""The report's sweep: every scenario, ethic against legacy over n_submit, the
scalability run and the kill_grace option. Resumable (a point whose JSON
exists is skipped), sequential (runs must not compete for the CPU).

``python -m gridrpc.experiments.sweep OUTDIR [--runs 3] [--time-scale 0.1] [--only PREFIX]``
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..core.scenarios import SCENARIOS
from .ethic import EthicConfig, run_experiment, write_outputs

N_SUBMIT = (3, 10, 30, 100, 190, 300, 1000)


def points(runs: int, scale: float, scale_big: float, runs_big: int) -> list[tuple[str, EthicConfig]]:
    pts: list[tuple[str, EthicConfig]] = []
    for sc in SCENARIOS:
        for acc in ("cumulative", "virtual"):
            pts.append((f"{sc}.ethic-{acc}", EthicConfig(scenario=sc, runs=runs, time_scale=scale,
                                                         accounting=acc)))
    for sc in SCENARIOS:
        for ns in N_SUBMIT:
            pts.append((f"{sc}.legacy-{ns}", EthicConfig(scenario=sc, runs=runs, time_scale=scale,
                                                         legacy=True, n_submit=ns)))
    for acc in ("cumulative", "virtual"):
        pts.append((f"scale.ethic-{acc}", EthicConfig(scenario="night-simultaneous", seds=138, clients=100,
                                                      n_max=10000, runs=runs_big, time_scale=scale_big,
                                                      accounting=acc, sed_processes=2)))
    for sc in ("day-regular", "night-consecutive"):
        for grace in (1.0, 3.0):
            pts.append((f"{sc}.ethic-virtual-grace{grace:g}",
                        EthicConfig(scenario=sc, runs=runs, time_scale=scale, accounting="virtual",
                                    kill_grace=grace)))
    for sc in ("day-regular", "day-diurnal-random"):
        pts.append((f"{sc}.ethic-virtual-skiplate",
                    EthicConfig(scenario=sc, runs=runs, time_scale=scale, accounting="virtual", skip_late=True)))
    pts.append(("day-regular.ethic-virtual-grace1-skiplate",
                EthicConfig(scenario="day-regular", runs=runs, time_scale=scale, accounting="virtual",
                            kill_grace=1.0, skip_late=True)))
    return pts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gridrpc.experiments.sweep")
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--big-time-scale", type=float, default=1.0)
    ap.add_argument("--big-runs", type=int, default=3)
    ap.add_argument("--only", default="", help="run the points whose name starts with this")
    a = ap.parse_args(argv)
    os.makedirs(a.outdir, exist_ok=True)
    for name, cfg in points(a.runs, a.time_scale, a.big_time_scale, a.big_runs):
        if not name.startswith(a.only):
            continue
        path = os.path.join(a.outdir, f"{name}.json")
        if os.path.exists(path):
            continue
        t = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            res = run_experiment(cfg, progress=lambda s: print("   " + s, flush=True))
        except Exception as exc:  # noqa: BLE001 - keep sweeping, note the failure
            print(f"   FAILED: {type(exc).__name__}: {exc}", flush=True)
            with open(path + ".failed", "w") as fh:
                fh.write(f"{type(exc).__name__}: {exc}\n")
            continue
        write_outputs(res, path, os.path.join(a.outdir, f"{name}.events.jsonl"))
        print(f"   -> unhappy={res['unhappy_users']} unfairness={res['unfairness']:.3f} "
              f"completed={res['completed']} ({time.monotonic() - t:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
