"""The benchmark suite: one command, one run, one table, one JSON file.

    python -m benchmarks [--quick] [--only NAME,...] [--json PATH]
    gridrpc bench ...            (same options)

Names for ``--only`` are item names (``call_bound``, ``ray_8mb`` ...) or
groups: ``floor``, ``tree``, ``curve``, ``discovery``, ``view``, ``memory``,
``ray``, ``dask``, ``gridrpc`` (tree + curve + discovery + view + memory +
load), ``peers`` (ray + dask). ``view``: discovery from pushed state against
the forced fan-out (benchmarks/view.py). ``load``: 64 independent load-test
clients, bound and with discovery in the same run (benchmarks/green_load.py). A ``*_curve`` item (tree A with CURVE) always brings its plain item:
the secure / plain ratio compares two rows of the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

from . import floor, green_load, grid, peers, report, view
from .procs import REPO, TOKEN, TOKEN_VAR, Procs, sweep

GROUPS: dict[str, tuple[str, ...]] = {
    "floor": ("floor_latency", "floor_throughput", "floor_8mb", "floor_hop_latency", "floor_rpc_latency"),
    "tree": grid.TREE_ITEMS + grid.DIAG_ITEMS,
    "curve": grid.CURVE_ITEMS,
    "discovery": ("discovery_100",),
    "view": view.ITEMS,
    "memory": ("memory_sed", "memory_replicas"),
    "load": green_load.ITEMS,
    "ray": ("ray_call", "ray_throughput", "ray_8mb"),
    "dask": ("dask_call", "dask_throughput", "dask_8mb"),
}
ALIASES = {"gridrpc": ("tree", "curve", "discovery", "view", "memory", "load"), "peers": ("ray", "dask")}
ALL_ITEMS = tuple(i for g in GROUPS.values() for i in g)
DEFAULT_JSON = REPO / "benchmarks" / "results" / "latest.json"


def select(only: str | None) -> set[str]:
    if not only:
        return set(ALL_ITEMS)
    out: set[str] = set()
    for name in (x.strip() for x in only.split(",") if x.strip()):
        if name in ALIASES:
            for g in ALIASES[name]:
                out.update(GROUPS[g])
        elif name in GROUPS:
            out.update(GROUPS[name])
        elif name in ALL_ITEMS:
            out.add(name)
        else:
            raise SystemExit(f"unknown benchmark {name!r}; items: {', '.join(ALL_ITEMS)}; "
                             f"groups: {', '.join([*GROUPS, *ALIASES])}")
    # ratios from one run: a CURVE item brings its plain item, a blocking-client item its asyncio one
    return out | {grid.PLAIN_OF[i] for i in out if i in grid.PLAIN_OF} | {grid.ASYNC_OF[i] for i in out
                                                                          if i in grid.ASYNC_OF}


def _peer(which: str, quick: bool, timeout: float) -> dict:
    with Procs() as procs:
        p = procs.spawn(f"peer-{which}", [sys.executable, "-m", "benchmarks.peers", which,
                                         *(["--quick"] if quick else [])])
        try:
            p.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{which} benchmark still running after {timeout}s; log tail:\n"
                               + p.log_tail()) from None
        for line in reversed(p.log_tail(200000).splitlines()):
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise RuntimeError(f"{which} benchmark failed (exit {p.popen.returncode}); log tail:\n{p.log_tail()}")


def _meta(args, quick: bool) -> dict:
    import numpy
    import psutil
    import zmq
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "gridrpc"],
                                    capture_output=True, text=True, timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if args is None else args,
            "quick": quick, "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(),
            "mem_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
            "numpy": numpy.__version__, "git_commit": commit, "gridrpc_dirty": dirty,
            "loadavg_start": list(os.getloadavg())}


def run(items: set[str], quick: bool, log=print) -> dict:
    os.environ[TOKEN_VAR] = TOKEN          # every child inherits it: the final sweep finds leftovers
    res: dict = {}
    skipped: dict[str, str] = {}
    errors: dict[str, str] = {}
    setup: dict = {}

    def step(name: str, group: tuple[str, ...], fn):
        todo = set(group) & items
        if not todo:
            return
        log(f"[bench] {name} ...")
        t0 = time.monotonic()
        try:
            out = fn(todo)
        except Exception as exc:  # noqa: BLE001 - one failing group must not hide the others
            errors[name] = f"{type(exc).__name__}: {exc}"
            log(f"[bench] {name} FAILED: {exc}\n{traceback.format_exc()}")
            return
        finally:
            sweep()
        setup.update(out.pop("_setup_s", {}))
        skipped.update({k: v for k, v in out.pop("_skipped", {}).items() if k in items})
        versions.update(out.pop("_version", {}))
        res.update({k: v for k, v in out.items() if k in items})
        log(f"[bench] {name} done in {time.monotonic() - t0:.1f}s")

    versions: dict = {}

    def with_procs(fn):
        def go(todo):
            with Procs() as procs:
                return fn(procs, todo)
        return go

    step("floor", GROUPS["floor"], with_procs(lambda p, todo: floor.run(p, todo, quick)))
    step("tree", GROUPS["tree"], with_procs(lambda p, todo: grid.run_tree(p, todo, quick)))
    step("curve", GROUPS["curve"], with_procs(lambda p, todo: grid.run_tree(p, todo, quick, secure=True)))
    step("discovery", GROUPS["discovery"], with_procs(lambda p, todo: grid.run_discovery_100(p, quick)))
    step("view", GROUPS["view"], lambda todo: view.run(todo, quick))     # its own Procs per tree
    step("memory", GROUPS["memory"], with_procs(lambda p, todo: grid.run_memory(p, todo, quick)))
    step("load", GROUPS["load"], with_procs(lambda p, todo: green_load.run_items(p, quick)))
    for which in ("ray", "dask"):
        why = peers.available(which) if set(GROUPS[which]) & items else None
        if why:
            for i in set(GROUPS[which]) & items:
                skipped[i] = why
            log(f"[bench] {which}: skipped, {why}")
            continue
        step(which, GROUPS[which], lambda todo, w=which: _peer(w, quick, 300 if not quick else 90))
    leftovers = sweep()
    return {"results": res, "skipped": skipped, "errors": errors, "setup_s": setup,
            "versions": versions, "leftover_processes_killed": leftovers}


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few iterations (CI smoke test, < 60 s)")
    p.add_argument("--only", metavar="NAME,...", help="items or groups to run (default: all)")
    p.add_argument("--json", metavar="PATH", default=str(DEFAULT_JSON),
                   help=f"write results here (default {DEFAULT_JSON.relative_to(REPO)})")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks") -> int:
    a = build_parser().parse_args(argv)
    return run_cli(a, prog)


def run_cli(a: argparse.Namespace, prog: str = "python -m benchmarks") -> int:
    items = select(a.only)
    t0 = time.monotonic()
    argv = [prog, *(["--quick"] if a.quick else []), *(["--only", a.only] if a.only else [])]
    meta = _meta(" ".join(argv), a.quick)
    out = run(items, a.quick, log=lambda s: print(s, file=sys.stderr, flush=True))
    meta["duration_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = list(os.getloadavg())
    targets = report.evaluate(out["results"])
    doc = {"meta": meta, **out, "targets": targets, "security_cost": report.security_cost(out["results"])}
    path = Path(a.json or DEFAULT_JSON)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"\n{' '.join(argv)}  ({meta['cpus']} CPUs, {meta['cpu']}, python {meta['python']}, "
          f"pyzmq {meta['pyzmq']}/libzmq {meta['libzmq']}, {meta['duration_s']}s, "
          f"load {meta['loadavg_start'][0]:.1f} -> {meta['loadavg_end'][0]:.1f})\n")
    main_table = report.table(out["results"], targets, out["skipped"])
    if main_table.count("\n") > 1:          # not only the header (e.g. --only view)
        print(main_table)
        print()
    sec = report.security_table(out["results"], doc["security_cost"], targets)
    if sec:
        print(sec)
        print()
    vt = report.view_table(out["results"], targets, out["skipped"])
    if vt:
        print(vt)
        print()
    cpu = report.cpu_table(out["results"])
    if cpu:
        print(cpu)
        print()
    print(report.targets_table([t for t in targets if any(t["item"] == i for i in items)]))
    for name, err in out["errors"].items():
        print(f"\nERROR in {name}: {err}")
    if out["leftover_processes_killed"]:
        print(f"\nnote: killed leftover processes {out['leftover_processes_killed']}")
    print(f"\nJSON: {path}")
    return 1 if out["errors"] else 0
