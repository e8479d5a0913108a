"""``gridrpc deploy up|down|status|logs|plan``."""
from __future__ import annotations

import argparse
import json
import sys


def add_deploy_parser(sub) -> None:
    p = sub.add_parser("deploy", help="deploy a tree from a YAML file (up, down, status, logs)")
    dsub = p.add_subparsers(dest="deploy_cmd", metavar="ACTION")
    for name, helptext in (("up", "start every element and wait until all registered"),
                           ("down", "stop every element of a deployment"),
                           ("status", "show the tree: host, pid, state, load"),
                           ("logs", "print an element's log")):
        q = dsub.add_parser(name, help=helptext)
        q.add_argument("file", help="deployment file (YAML), or a deployment name for down/status/logs")
        q.add_argument("--state-dir", help="where the deployment state is kept (default ~/.gridrpc/deployments/NAME)")
        if name == "logs":
            q.add_argument("element")
            q.add_argument("-n", "--lines", type=int, default=50)
        if name in ("status", "up"):
            q.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _deployment(a):
    from pathlib import Path
    from .runner import Deployment, state_root
    from .spec import load
    path = Path(a.file)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        spec = load(path)
        return Deployment(spec, state_dir=a.state_dir) if a.deploy_cmd == "up" else \
            Deployment.load_state(a.state_dir or state_root() / spec.name, spec)
    return Deployment.load_state(a.state_dir or state_root() / a.file)


def run(a: argparse.Namespace) -> int:
    from ..errors import GridRPCError
    if not getattr(a, "deploy_cmd", None):
        print("usage: gridrpc deploy {up,down,status,logs} FILE", file=sys.stderr)
        return 2
    try:
        d = _deployment(a)
        if a.deploy_cmd == "up":
            summary = d.up()
            if a.json:
                print(json.dumps(summary, indent=2))
            else:
                print(f"MA: {summary['ma']}")
        elif a.deploy_cmd == "down":
            stopped = d.down()
            print(f"stopped {len(stopped)} element(s)")
        elif a.deploy_cmd == "status":
            rows = d.status()
            if a.json:
                print(json.dumps(rows, indent=2))
            else:
                print(f"{'name':14s} {'kind':4s} {'parent':10s} {'host':12s} {'pid':>8s} "
                      f"{'process':8s} {'tree':6s} load")
                for r in rows:
                    load = " ".join(f"{k}={v}" for k, v in r["load"].items() if k in
                                    ("num_running", "num_waiting", "children", "completed"))
                    print(f"{r['name']:14s} {r['kind']:4s} {r['parent'] or '-':10s} {r['host']:12s} "
                          f"{r['pid'] or '-':>8} {r['process']:8s} {r['tree']:6s} {load}")
            return 0 if all(r["process"] == "running" and r["tree"] == "alive" for r in rows) else 1
        elif a.deploy_cmd == "logs":
            print(d.logs(a.element, a.lines))
    except GridRPCError as exc:
        print(f"gridrpc deploy {a.deploy_cmd}: {exc}", file=sys.stderr)
        return 1
    return 0
