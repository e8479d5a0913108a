"""``gridrpc workflow run FILE``: run a workflow file against a tree.

The file (YAML)::

    nodes:
      a: {service: produce, args: [1000000]}
      b: {service: transform, args: [$a]}
      c: {service: reduce_sum, args: [$b]}

Nodes are placed with HEFT on the servers' estimates; their data moves SeD
to SeD. Progress is printed as nodes end; the exit code is 0 when every node
succeeded, 1 otherwise (failed nodes and their descendants are listed).
"""
from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("workflow", help="run a workflow (DAG of calls) from a YAML file",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    wsub = p.add_subparsers(dest="workflow_command", required=True)
    r = wsub.add_parser("run", help="run FILE and print progress")
    r.add_argument("file", metavar="FILE")
    r.add_argument("--ma", default=None, metavar="ADDR", help="master agent (default: $GRIDRPC_MA)")
    r.add_argument("--user", default=None, help="user name sent with the calls")
    r.add_argument("--timeout", type=float, default=None, help="seconds for the whole workflow")
    r.add_argument("--bandwidth", type=float, default=1e9, help="bytes/s assumed between SeDs (HEFT)")
    r.set_defaults(func=run)
    return p


def run(a: argparse.Namespace) -> int:
    import os

    import gridrpc
    from . import load
    try:
        with open(a.file, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        print(f"gridrpc workflow run: cannot read {a.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    ma = a.ma or os.environ.get("GRIDRPC_MA") or "tcp://127.0.0.1:5555"
    if "://" not in ma:
        ma = "tcp://" + ma
    try:
        with gridrpc.Client(ma, user=a.user) as client:
            wf = load(text, client, bandwidth=a.bandwidth)
            res = wf.run(a.timeout)
    except gridrpc.ConfigError as exc:
        print(f"gridrpc workflow run: {a.file}: {exc}", file=sys.stderr)
        return 2
    except gridrpc.GridRPCError as exc:
        print(f"gridrpc workflow run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    for name, value in res.results.items():
        print(f"{name} = {value!r}")
    for name, err in res.errors.items():
        print(f"{name}: {err}", file=sys.stderr)
    return 0 if res.ok else 1
