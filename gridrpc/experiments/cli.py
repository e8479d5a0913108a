"""``gridrpc experiment ...`` (registered by :mod:`gridrpc.cli`)."""
from __future__ import annotations

import argparse
import sys

from ..core.scenarios import SCENARIOS


def add_parser(sub) -> None:
    p = sub.add_parser("experiment", help="run the experiments (fair optional computations: ethic)")
    esub = p.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    e = esub.add_parser(
        "ethic", help="a DIET-ethic scenario (or the legacy baseline) on a real local tree, or simulated",
        description="Start a local tree (1 MA, N sleep SeDs with the ethic queue, or one arrival order (fifo, DIET's FCFS) with --legacy), "
                    "run the clients of a scenario, print unhappy users, unfairness and completed requests "
                    "(medians over --runs), write JSON and an event log. Times are in the paper's units and "
                    "multiplied by --time-scale (0.1: T = 1 -> 100 ms, d = 100 -> 10 s). With --simulate, no tree: "
                    "the same core objects on a virtual clock with the runtime's overheads, same JSON.",
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
    e.add_argument("--gather", type=float, default=0.0,
                   help="ethic queue: an idle SeD starts no optional request while they keep arriving less "
                        "than this many seconds apart (at most 0.5 s): a burst of users is ranked whole "
                        "(default 0: the paper's SeD)")
    e.add_argument("--accounting", choices=["cumulative", "virtual"], default="cumulative",
                   help="ethic rule 4: allocation since the SeD started (paper) or start-time fair queuing")
    e.add_argument("--skip-late", action="store_true",
                   help="ethic clients send no optional request that would end after the deadline")
    e.add_argument("--sed-processes", type=int, default=1, help="SeD processes holding the N SeDs as replicas")
    s = e.add_argument_group("simulation (--simulate: no tree, the same core objects on a virtual clock "
                             "with the runtime's calibrated overheads; docs/simulation-ethic.md)")
    s.add_argument("--simulate", action="store_true", help="simulate the run instead of starting a tree")
    s.add_argument("--costs", metavar="PATH", default=None,
                   help="overheads from this `gridrpc sim calibrate -o` JSON (default: the built-in DEFAULT_COSTS)")
    s.add_argument("--no-overheads", action="store_true",
                   help="zero overheads (with --per-call-client: the zero-latency simulation of "
                        "gridrpc.experiments.sim)")
    s.add_argument("--overhead-factor", type=float, default=None,
                   help="multiply every CPU and latency overhead by this (a loaded host is a slower host)")
    s.add_argument("--client-processes", type=int, default=None,
                   help="client processes sharing the users round-robin (the real runner has 1)")
    s.add_argument("--horizon", type=float, default=None, metavar="SECONDS",
                   help="stop the simulated clock at this time of the run (s, after --time-scale); users "
                        "not started by then count as unhappy")
    s.add_argument("--per-call-client", action="store_true",
                   help="simulate the runtime's client before batches: one message per CALL and CANCEL, a "
                        "user's first calls as one burst (default: today's, mandatory calls first in their "
                        "own batch, a loop iteration's messages to a server as one)")
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
                          gather=a.gather,
                          accounting=a.accounting, sed_processes=a.sed_processes,
                          skip_late=a.skip_late)
    except ValueError as exc:
        print(f"gridrpc experiment ethic: {exc}", file=sys.stderr)
        return 2
    try:
        overheads = _overheads(a)
    except (ValueError, OSError) as exc:
        print(f"gridrpc experiment ethic: {exc}", file=sys.stderr)
        return 2
    label = f"legacy n_submit={cfg.n_submit}" if cfg.legacy else f"ethic ({cfg.accounting})"
    print(f"{cfg.scenario}: {label}, {cfg.seds} SeDs, time scale {cfg.time_scale:g}, {cfg.runs} run(s)"
          + (" (simulated)" if a.simulate else ""), file=sys.stderr)
    if a.simulate:
        from .sim_run import run_simulated
        res = run_simulated(cfg, overheads=overheads, client_processes=a.client_processes or 1,
                            horizon=a.horizon, per_call_client=a.per_call_client,
                            progress=lambda s: print(s, file=sys.stderr))
    else:
        # SIGTERM as Ctrl-C: the tree's processes live in their own sessions and are stopped only by
        # run_experiment's way out (a plain SIGTERM left the MA, 2 SeD processes and 138 workers).
        # Delivered as SIGINT: inside asyncio.run, SIGINT cancels the main task, whereas a
        # KeyboardInterrupt raised here could land in any task's step, which then kept it and
        # logged "Task exception was never retrieved" with a traceback at exit
        import signal

        def _term(_signum, _frame):
            signal.raise_signal(signal.SIGINT)
        old = signal.signal(signal.SIGTERM, _term)
        try:
            res = run_experiment(cfg, progress=lambda s: print(s, file=sys.stderr))
        except KeyboardInterrupt:
            print("gridrpc experiment ethic: interrupted; the experiment's tree is stopped, nothing written",
                  file=sys.stderr)
            return 130
        finally:
            signal.signal(signal.SIGTERM, old)
    events = a.events or (a.json[:-5] if a.json.endswith(".json") else a.json) + ".events.jsonl"
    write_outputs(res, a.json, events)
    print(f"unhappy_users {res['unhappy_users']:g}")
    print(f"unfairness {res['unfairness']:.4f}")
    print(f"completed {res['completed']:g}")
    print(f"completed_by_deadline {res['completed_by_deadline']:g}")
    return 0


def _overheads(a: argparse.Namespace):
    """The simulation's overheads from the options (None without --simulate);
    simulation options without --simulate are an error."""
    sim_only = [flag for flag, set_ in (("--costs", a.costs is not None), ("--no-overheads", a.no_overheads),
                                        ("--overhead-factor", a.overhead_factor is not None),
                                        ("--client-processes", a.client_processes is not None),
                                        ("--horizon", a.horizon is not None),
                                        ("--per-call-client", a.per_call_client)) if set_]
    if not a.simulate:
        if sim_only:
            raise ValueError(f"{', '.join(sim_only)} only make(s) sense with --simulate")
        return None
    if a.client_processes is not None and a.client_processes < 1:
        raise ValueError("--client-processes must be >= 1")
    if a.horizon is not None and not a.horizon >= 0:
        raise ValueError("--horizon must be >= 0")
    if a.no_overheads and (a.costs is not None or a.overhead_factor is not None):
        raise ValueError("--no-overheads excludes --costs and --overhead-factor")
    from .overheads import Overheads
    if a.no_overheads:
        return Overheads.zero()
    if a.costs is not None:
        from pathlib import Path
        if not Path(a.costs).is_file():
            raise ValueError(f"--costs: no such file: {a.costs}")
        try:
            o = Overheads.from_costs(a.costs)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"--costs {a.costs}: not a cost file of `gridrpc sim calibrate -o` ({exc})") from None
    else:
        o = Overheads.from_costs()
    if a.overhead_factor is not None:
        o = o.scaled(a.overhead_factor)
    return o
