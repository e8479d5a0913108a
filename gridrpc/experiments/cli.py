"""``gridrpc experiment ...`` (registered by :mod:`gridrpc.cli`)."""
from __future__ import annotations

import argparse
import sys

from ..core.scenarios import SCENARIOS


def add_parser(sub) -> None:
    p = sub.add_parser("experiment", help="run the experiments (fair optional computations: ethic)")
    esub = p.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    e = esub.add_parser(
        "ethic", help="a DIET-ethic scenario (or the legacy baseline) on a real local tree",
        description="Start a local tree (1 MA, N sleep SeDs with the ethic queue, or FCFS with --legacy), "
                    "run the clients of a scenario, print unhappy users, unfairness and completed requests "
                    "(medians over --runs), write JSON and an event log. Times are in the paper's units and "
                    "multiplied by --time-scale (0.1: T = 1 -> 100 ms, d = 100 -> 10 s).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("--scenario", choices=SCENARIOS, default="night-simultaneous")
    e.add_argument("--seds", type=int, default=10, help="number of SeDs (n_R)")
    e.add_argument("--clients", type=int, default=10, help="number of users (ignored by the diurnal scenarios)")
    e.add_argument("--deadline", type=float, default=100.0, help="deadline after arrival, s (paper units)")
    e.add_argument("--task-time", type=float, default=1.0, help="T, duration of a request, s (paper units)")
    e.add_argument("--n-min", type=int, default=3, help="mandatory requests per user")
    e.add_argument("--n-max", type=int, default=1000, help="maximum requests per user")
    e.add_argument("--arrival-interval", type=float, default=None,
                   help="s between arrivals (night-consecutive: 0.1, day-regular: 10)")
    e.add_argument("--runs", type=int, default=1, help="repetitions (medians reported)")
    e.add_argument("--seed", type=int, default=0, help="seed of run 0 (run i uses seed+i)")
    e.add_argument("--legacy", action="store_true", help="baseline: FCFS SeDs, clients submit --n-submit at once")
    e.add_argument("--n-submit", type=int, default=None, help="requests each legacy client submits")
    e.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply every time (arrivals, deadline, T) by this")
    e.add_argument("--kill-grace", type=float, default=0.0,
                   help="ethic queue: s (paper units) a new mandatory request waits before killing optional ones")
    e.add_argument("--accounting", choices=["cumulative", "virtual"], default="cumulative",
                   help="ethic rule 4: allocation since the SeD started (paper) or start-time fair queuing")
    e.add_argument("--skip-late", action="store_true",
                   help="ethic clients send no optional request that would end after the deadline")
    e.add_argument("--sed-processes", type=int, default=1, help="SeD processes holding the N SeDs as replicas")
    e.add_argument("--json", required=True, metavar="PATH", help="write the results here")
    e.add_argument("--events", metavar="PATH", default=None,
                   help="event log, JSON lines (default: PATH of --json with .events.jsonl)")
    e.set_defaults(func=cmd_ethic)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def cmd_ethic(a: argparse.Namespace) -> int:
    from .ethic import EthicConfig, run_experiment, write_outputs
    try:
        cfg = EthicConfig(scenario=a.scenario, seds=a.seds, clients=a.clients, deadline=a.deadline,
                          task_time=a.task_time, n_min=a.n_min, n_max=a.n_max,
                          arrival_interval=a.arrival_interval, runs=a.runs, seed=a.seed, legacy=a.legacy,
                          n_submit=a.n_submit, time_scale=a.time_scale, kill_grace=a.kill_grace,
                          accounting=a.accounting, sed_processes=a.sed_processes,
                          skip_late=a.skip_late)
    except ValueError as exc:
        print(f"gridrpc experiment ethic: {exc}", file=sys.stderr)
        return 2
    label = f"legacy n_submit={cfg.n_submit}" if cfg.legacy else f"ethic ({cfg.accounting})"
    print(f"{cfg.scenario}: {label}, {cfg.seds} SeDs, time scale {cfg.time_scale:g}, {cfg.runs} run(s)",
          file=sys.stderr)
    res = run_experiment(cfg, progress=lambda s: print(s, file=sys.stderr))
    events = a.events or (a.json[:-5] if a.json.endswith(".json") else a.json) + ".events.jsonl"
    write_outputs(res, a.json, events)
    print(f"unhappy_users {res['unhappy_users']:g}")
    print(f"unfairness {res['unfairness']:.4f}")
    print(f"completed {res['completed']:g}")
    print(f"completed_by_deadline {res['completed_by_deadline']:g}")
    return 0
