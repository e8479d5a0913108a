"""``gridrpc sim``: simulate trees on the real core (docs/simulation.md).

    gridrpc sim run --seds 500 --shape flat            # discovery latency + calls/s on this host's model
    gridrpc sim run --seds 8 --engine simgrid --platform deployments/sim/two-sites.xml   # on SimGrid
    gridrpc sim calibrate -o costs.json                # fit costs to the stored measurements
    gridrpc sim calibrate --quick -o host.json         # this host's profile: cores, single-core speed
    gridrpc sim predict --study S.json --host-profile host.json   # a measured study, predicted step by step
    gridrpc sim validate --json v.json --plot v.png    # predicted vs measured, every stored tree
    gridrpc sim scale --seds 100000 --clients 10000    # shapes compared at scale (cluster placement)
    gridrpc sim trace FILE.swf [--policy least_wait_time] # replay an SWF job trace through batch SeDs
    gridrpc sim trace-generate --jobs 3000 --seed 1 OUT.swf   # a synthetic SWF trace
"""
from __future__ import annotations

import argparse
import json
import sys

from ..cli.values import positive_int


def shape_arg(text: str) -> str:
    """An argparse type for ``--shape``: ``flat``, ``L<levels>-<children per agent>``
    (both >= 1), or agents per level ``1,8,64`` (each >= 1)."""
    parts = text.split(",")
    if len(parts) > 1:
        if not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
            raise argparse.ArgumentTypeError(f"{text!r}: agents per level must be whole numbers >= 1, e.g. 1,8,64")
        return text
    if text == "flat":
        return text
    levels, sep, d = text.partition("-")
    levels = levels[1:] if levels[:1] in ("L", "l") else ""
    if not (sep and levels.isdigit() and d.isdigit() and int(levels) >= 1 and int(d) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape: flat, L<levels>-<children per agent> "
                                         "(e.g. L2-8), or agents per level (e.g. 1,8,64)")
    return text


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sim", help="discrete-event simulation of trees on the real scheduling core",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="sim_cmd")
    r = s.add_parser("run", help="simulate one tree: sequential discoveries and a closed-loop load")
    r.add_argument("--seds", type=positive_int, required=True, help="SeDs (per site on a platform of several sites)")
    r.add_argument("--shape", type=shape_arg, default="flat", help="flat, L2-D, L3-D, or agents per level like 1,8,64")
    r.add_argument("--users", type=positive_int, default=8)
    r.add_argument("--placement", choices=("single", "cluster"), default="single")
    r.add_argument("--cores", type=positive_int, default=None,
                   help="cores of the host (default: the host profile's, else 2)")
    r.add_argument("--speed", type=float, default=None,
                   help="single-core speed relative to the costs' reference host (default: the profile's, else 1)")
    r.add_argument("--host-profile", help="a host profile (gridrpc sim calibrate --quick -o FILE)")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--costs", help="costs file (default: the host profile's, else the built-in costs)")
    r.add_argument("--no-views", dest="views", action="store_false",
                   help="agents without pushed views: every discovery a fan-out (gridrpc ma|la --no-view); "
                        "default: views, as the daemons")
    r.add_argument("--reuse", type=float, default=None,
                   help="the load generator's reuse window of view answers, s (default: gridrpc loadtest's)")
    from .simgrid_cli import add_engine_arguments
    add_engine_arguments(r)
    c = s.add_parser("calibrate", help="fit the costs to benchmarks' stored JSON results")
    c.add_argument("--study", action="append",
                   help="the study's JSON (default benchmarks/scalability/results/latest.json); give it "
                        "several times to fit on several measurements together (every run a row)")
    c.add_argument("--suite", default="benchmarks/results/latest.json")
    c.add_argument("--max-load", type=float, default=15.0, help="latency fit: runs at load average <= this")
    c.add_argument("--iterations", type=positive_int, default=3,
                   help="passes of count-then-fit (wake-ups depend on the costs being fitted)")
    c.add_argument("--time-slice", type=float, default=3.0,
                   help="ms a process keeps its core for its queued jobs while others wait (the costs are "
                        "fitted for it)")
    c.add_argument("--crowding", action="store_true",
                   help="also fit a growth of every element's CPU with the processes per core "
                        "(x max(1, processes/cores) ** exponent); off: it did not improve the validation")
    c.add_argument("--quick", action="store_true",
                   help="only this host's profile (cores, single-core speed against the costs' reference host; "
                        "a few seconds): write it with -o, use it with --host-profile")
    c.add_argument("--cores", type=positive_int,
                   help="the measured host's cores (default 2; --quick: those this process may use)")
    c.add_argument("-o", "--output")
    v = s.add_parser("validate", help="predict every stored tree of the scalability study, compare")
    v.add_argument("--study", action="append",
                   help="the study's JSON (default benchmarks/scalability/results/latest.json); give it "
                        "several times to compare one prediction per tree with several measurements of it")
    v.add_argument("--costs")
    v.add_argument("--max-load", type=float, default=None,
                   help="one study: count only the trees measured at this load average or less; several: "
                        "leave out the measurements taken above it")
    v.add_argument("--seeds", type=positive_int, default=3, help="closed-loop runs per tree (the median is compared)")
    v.add_argument("--json")
    v.add_argument("--plot")
    pr = s.add_parser("predict", help="predict a measured study on a host profile, every run and load step")
    pr.add_argument("--study", action="append", required=True,
                    help="python -m benchmarks.scalability --out FILE (repeatable)")
    pr.add_argument("--host-profile", help="the host's profile (default: 2 cores, the reference speed)")
    pr.add_argument("--cores", type=positive_int, help="override the profile's cores")
    pr.add_argument("--speed", type=float, help="override the profile's speed")
    pr.add_argument("--costs", help="costs file (default: the profile's, else the built-in costs)")
    pr.add_argument("--views", action=argparse.BooleanOptionalAction, default=None,
                    help="pushed views on/off (default: as the study was measured)")
    pr.add_argument("--seeds", type=positive_int, default=1, help="closed-loop runs per load step (median)")
    pr.add_argument("--tolerance", type=float, default=0.25)
    pr.add_argument("--json")
    g = s.add_parser("scale", help="compare shapes at scale (agents and SeD processes on hosts of their own)")
    g.add_argument("--seds", type=positive_int, default=100000)
    g.add_argument("--clients", type=positive_int, default=10000)
    g.add_argument("--shapes", default="L3-15,1+316,1+46+2128,1+18+309+5556,L4-7",
                   help="comma-separated: flat, L2-D, L3-D, L4-D, or agents per level like 1+46+2128 "
                        "(default: L3-15, L4-7 and the shapes 'deploy plan' proposes for 100,000 SeDs)")
    g.add_argument("--seconds", type=float, default=2.0, help="simulated seconds measured per shape")
    g.add_argument("--calls-per-client", type=float, default=0.02, help="calls per client in that window")
    g.add_argument("--replicas", type=positive_int, default=32, help="SeDs per SeD process (per host)")
    g.add_argument("--no-views", dest="views", action="store_false",
                   help="SeDs push no snapshots: every discovery fans out (the default: pushed views)")
    g.add_argument("--hb-interval", type=float, default=1.0, help="heartbeat period of every element (s); "
                   "the view's freshness bound is 1.5 periods")
    g.add_argument("--warmup", type=float, default=0.5, help="simulated seconds before the measured window")
    g.add_argument("--json")
    from .trace_cli import add_trace_parsers
    add_trace_parsers(s)
    p.set_defaults(func=run)
    return p


def run(a) -> int:
    if a.sim_cmd == "trace":
        from .trace_cli import cmd_trace
        return cmd_trace(a)
    if a.sim_cmd == "trace-generate":
        from .trace_cli import cmd_generate
        return cmd_generate(a)
    from .model import Costs
    if a.sim_cmd == "calibrate" and a.quick:
        from .host import quick_profile
        prof = quick_profile(cores=a.cores)
        if a.output:
            prof.save(a.output)
        print(json.dumps(prof.__dict__, indent=1))
        return 0
    if a.sim_cmd == "calibrate":
        from .calibrate import cmd_calibrate
        return cmd_calibrate(a)
    if a.sim_cmd == "predict":
        from .host_check import cmd_predict
        return cmd_predict(a)
    if a.sim_cmd == "validate":
        from .validate import cmd_validate
        return cmd_validate(a)
    if a.sim_cmd == "scale":
        from .scale import cmd_scale
        return cmd_scale(a)
    if a.sim_cmd == "run" and a.engine == "simgrid":
        from .simgrid_cli import cmd_run_simgrid
        return cmd_run_simgrid(a)
    if a.sim_cmd == "run":
        from .host import HostProfile
        from .simgrid_cli import measure_tree
        from .world import LOADTEST_REUSE
        prof = HostProfile.load(a.host_profile) if a.host_profile else HostProfile(cores=2)
        cores = a.cores if a.cores is not None else prof.cores
        speed = a.speed if a.speed is not None else prof.speed
        out = measure_tree("builtin", a.shape, a.seds, users=a.users, seed=a.seed, costs=Costs.load(a.costs or prof.costs),
                           rounds=a.rounds, seconds=a.seconds, placement=a.placement, cores=cores, speed=speed,
                           views=a.views, reuse=LOADTEST_REUSE if a.reuse is None else a.reuse)
        print(json.dumps(out, indent=1))
        return 0
    print("usage: gridrpc sim {run,calibrate,predict,validate,scale,trace,trace-generate} ...", file=sys.stderr)
    return 2
