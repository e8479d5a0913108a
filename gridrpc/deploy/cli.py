"""``gridrpc deploy up|down|status|logs|plan|calibrate``."""
from __future__ import annotations

import argparse
import json
import sys


def add_deploy_parser(sub) -> None:
    p = sub.add_parser("deploy", help="deploy a tree from a YAML file (up, down, status, logs, plan)")
    dsub = p.add_subparsers(dest="deploy_cmd", metavar="ACTION")
    for name, helptext in (("up", "start every element and wait until all registered"),
                           ("down", "stop every element of a deployment (also on remote hosts)"),
                           ("status", "show the tree: host, pid, state, load"),
                           ("logs", "print an element's log")):
        q = dsub.add_parser(name, help=helptext)
        q.add_argument("file", help="deployment file (YAML), or a deployment name for down/status/logs")
        q.add_argument("--state-dir", help="where the deployment state is kept "
                                           "(default $GRIDRPC_HOME or ~/.gridrpc, then deployments/NAME)")
        if name == "logs":
            q.add_argument("element")
            q.add_argument("-n", "--lines", type=int, default=50)
        if name in ("status", "up"):
            q.add_argument("--json", action="store_true")
        if name == "up":
            q.add_argument("--ready-timeout", type=float, default=20.0,
                           help="seconds each element has to print READY (default 20)")
            q.add_argument("--register-timeout", type=float, default=30.0,
                           help="seconds for all elements to appear at the MA (default 30)")
        if name == "down":
            q.add_argument("--timeout", type=float, default=10.0,
                           help="seconds between SIGTERM and SIGKILL (default 10)")
    q = dsub.add_parser("plan", help="propose a tree shape for N SeDs on some hosts and write a deployment file")
    q.add_argument("--seds", type=int, required=True, help="number of SeDs")
    q.add_argument("--hosts", required=True, help="YAML file with a 'hosts:' mapping (deployment file syntax, "
                                                  "plus optional 'seds: N' and 'agents: false' per host)")
    q.add_argument("-o", "--output", help="deployment file to write (default: print it)")
    q.add_argument("--figures", help="JSON file from 'gridrpc deploy calibrate' (default: built-in figures)")
    q.add_argument("--max-levels", type=int, default=4, help="most agent levels to consider (default 4)")
    q.add_argument("--max-fanout", type=int, default=None, help="most children per agent")
    q.add_argument("--services", default="examples",
                   help="comma-separated MODULE:FUNC for every SeD, or 'examples' (default)")
    q.add_argument("--name", help="deployment name (default: from the output file)")
    q.add_argument("--ma-port", type=int, default=5555)
    q.add_argument("--tolerance", type=float, default=0.1,
                   help="take the shape with fewest agents among those predicted within this fraction "
                        "of the fastest (default 0.1)")
    q.add_argument("--min-gain", type=float, default=0.5,
                   help="... or within this many milliseconds (default 0.5)")
    q.add_argument("--pack", action="store_true",
                   help="one SeD process per (host, parent) with replicas instead of one per SeD")
    q = dsub.add_parser("calibrate", help="measure discovery cost per child and per hop (in-process tree)")
    q.add_argument("--seds", default="50,100,200", help="comma-separated SeD counts (default 50,100,200)")
    q.add_argument("--las", default="5", help="comma-separated LA counts for the two-level runs (default 5)")
    q.add_argument("--rounds", type=int, default=30, help="discoveries per measurement (default 30)")
    q.add_argument("-o", "--output", help="write the figures as JSON here")
    p.set_defaults(func=run)


def _deployment(a):
    from pathlib import Path
    from .runner import Deployment, state_root
    from .spec import load
    path = Path(a.file)
    is_file = path.suffix in (".yaml", ".yml", ".json") or path.is_file()
    if a.deploy_cmd == "up":
        if not is_file:
            from ..errors import ConfigError
            raise ConfigError(f"deployment file {a.file} not found")
        return Deployment(load(path), state_dir=a.state_dir, ready_timeout=a.ready_timeout,
                          register_timeout=a.register_timeout)
    if is_file:
        spec = load(path)
        return Deployment.load_state(a.state_dir or state_root() / spec.name, spec)
    return Deployment.load_state(a.state_dir or state_root() / a.file)


def run(a: argparse.Namespace) -> int:
    from ..errors import GridRPCError
    if not getattr(a, "deploy_cmd", None):
        print("usage: gridrpc deploy {up,down,status,logs,plan,calibrate} ...", file=sys.stderr)
        return 2
    if a.deploy_cmd == "plan":
        from .plan import cmd_plan
        return cmd_plan(a)
    if a.deploy_cmd == "calibrate":
        from .plan import cmd_calibrate
        return cmd_calibrate(a)
    d = None
    try:
        d = _deployment(a)
        if a.deploy_cmd == "up":
            summary = d.up()
            if a.json:
                print(json.dumps(summary, indent=2))
            else:
                print(f"MA: {summary['ma']}")
        elif a.deploy_cmd == "down":
            d.stop_timeout = a.timeout
            stopped = d.down()
            print(f"stopped {len(stopped)} element(s)")
            if d.down_errors:
                by_error: dict[str, list[str]] = {}
                for n, e in d.down_errors.items():
                    by_error.setdefault(e, []).append(n)
                print(f"gridrpc deploy down: could not stop {len(d.down_errors)} element(s):\n"
                      + "\n".join(f"  - {', '.join(ns)}: {e}" for e, ns in by_error.items())
                      + f"\n(state kept in {d.state_dir}; run 'gridrpc deploy down' again)", file=sys.stderr)
                return 1
        elif a.deploy_cmd == "status":
            from .runner import format_status
            rows = d.status()
            if a.json:
                print(json.dumps(rows, indent=2))
            else:
                print(format_status(rows))
            return 0 if all(r["process"] == "running" and r["tree"] == "alive" for r in rows) else 1
        elif a.deploy_cmd == "logs":
            sys.stdout.write(d.logs(a.element, a.lines))
    except GridRPCError as exc:
        print(f"gridrpc deploy {a.deploy_cmd}: {exc}", file=sys.stderr)
        return 1
    finally:
        if d is not None:
            d.close()
    return 0
