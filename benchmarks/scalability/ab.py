"""A/B: discovery latency and CPU of the same tree shape on two versions of
gridrpc, side by side (interleaved blocks, same background load).

    python -m benchmarks.scalability.ab --old ae2f313~1 --n 500 --shape flat

``--old`` is any git revision: its ``gridrpc/`` is exported (``git archive``)
to a temporary directory and that tree's processes run with it on their
PYTHONPATH; the other tree runs the working copy. The client is this
checkout's ``gridrpc.Client`` for both (the wire protocol is the same).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .measure import CpuMeter, pct, tmpdir
from .tree import Shape, TreeProcs

ROOT = Path(__file__).resolve().parents[2]


def export(rev: str) -> tuple[Path, str]:
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    dest = tmpdir(f"gridrpc-ab-{sha}-")
    archive = subprocess.run(["git", "archive", sha, "gridrpc"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest, sha


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scalability.ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="git revision to compare with the working copy")
    ap.add_argument("--n", type=int, default=500, help="SeDs (default 500)")
    ap.add_argument("--shape", default="flat", help="flat, L2-D, L3-D (default flat)")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--per-block", type=int, default=40)
    ap.add_argument("--out", default=None, help="JSON (default benchmarks/scalability/results/ab-REV-N.json)")
    a = ap.parse_args(argv)
    import gridrpc
    src, sha = export(a.old)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    shape = Shape.parse(a.shape)
    variants = {f"old {sha}": {"PYTHONPATH": str(src)}, f"new {head}+wc": None}
    trees, res = {}, {}
    try:
        for name, env in variants.items():
            t = TreeProcs(shape, a.n, tmpdir("gridrpc-ab-tree-"), env=env)
            trees[name] = t
            t.start(timeout=300)
            print(f"{name}: {len(t.procs)} processes, {a.n} SeDs registered", flush=True)
        meters = {n: CpuMeter(t.pids()) for n, t in trees.items()}
        for m in meters.values():
            m.start()
        time.sleep(3)
        idle = {n: sum(m.stop().values()) for n, m in meters.items()}
        lat = {n: [] for n in trees}
        cpu_ms = {n: [] for n in trees}
        clients = {n: gridrpc.Client(t.ma_address, discovery_timeout=10) for n, t in trees.items()}
        try:
            for c in clients.values():
                for _ in range(10):
                    c.discover("noop", 3)
            for b in range(a.blocks):
                order = list(clients) if b % 2 == 0 else list(reversed(clients))
                for n in order:
                    meters[n].start()
                    t0 = time.monotonic()
                    ms = []
                    for _ in range(a.per_block):
                        s = time.perf_counter()
                        clients[n].discover("noop", 3)
                        ms.append((time.perf_counter() - s) * 1000)
                    busy = sum(meters[n].stop().values())
                    lat[n].extend(ms)
                    cpu_ms[n].append(max(0.0, busy - idle[n]) / 100 * (time.monotonic() - t0) * 1000 / len(ms))
                print(f"block {b + 1}/{a.blocks}: " + ", ".join(
                    f"{n} {statistics.median(lat[n][-a.per_block:]):.1f} ms" for n in lat), flush=True)
        finally:
            for c in clients.values():
                c.close()
        for n, v in lat.items():
            res[n] = {"median_ms": pct(v, 0.5), "p90_ms": pct(v, 0.9), "p99_ms": pct(v, 0.99),
                      "cpu_ms_per_discovery": statistics.median(cpu_ms[n]), "idle_cpu_pct": idle[n],
                      "rounds": len(v)}
    finally:
        for t in trees.values():
            t.stop()
        shutil.rmtree(src, ignore_errors=True)
    print(f"{a.n} SeDs, {shape.name}, {a.blocks}x{a.per_block} interleaved discoveries (load avg {os.getloadavg()[0]:.1f})")
    print(f"{'version':18s} {'median':>8s} {'p90':>8s} {'p99':>8s} {'cpu/disc':>9s} {'idle cpu':>9s}")
    for n, r in res.items():
        print(f"{n:18s} {r['median_ms']:8.1f} {r['p90_ms']:8.1f} {r['p99_ms']:8.1f} {r['cpu_ms_per_discovery']:8.1f}ms "
              f"{r['idle_cpu_pct']:8.0f}%")
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "scalability" / "results" / f"ab-{sha}-{a.n}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"old": sha, "new": head, "n": a.n, "shape": shape.name,
                               "loadavg": os.getloadavg(), "results": res}, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
