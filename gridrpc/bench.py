"""``gridrpc bench``: run the benchmark suite (``benchmarks/`` of a source
checkout) — the same as ``python -m benchmarks`` from the repository root.

It measures, in one run on this machine, the raw pyzmq floor, gridrpc on
real processes (calls with and without discovery, async throughput, 8 MB
arrays, discovery over 100 SeDs, SeD memory) and, when installed (extra
``[bench]``), Ray and Dask; prints a table with ratios and the targets, and
writes JSON. See docs/performance.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="run the benchmark suite (floor, gridrpc, Ray/Dask when installed)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few iterations (CI smoke test, < 60 s)")
    p.add_argument("--only", metavar="NAME,...",
                   help="items or groups to run: floor, tree, discovery, memory, ray, dask, gridrpc, "
                        "peers, or item names such as call_bound (default: all)")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="write results here (default benchmarks/results/latest.json)")
    p.set_defaults(func=run)
    return p


def _suite():
    """The suite module of the checkout this gridrpc comes from."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "suite.py").exists():
        return None
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import benchmarks.suite as suite
    if Path(suite.__file__).resolve().parent.parent != root:   # another 'benchmarks' shadowed ours
        return None
    return suite


def run(a: argparse.Namespace) -> int:
    suite = _suite()
    if suite is None:
        print("gridrpc bench: the benchmark suite lives in the source repository (benchmarks/); "
              "run it from a checkout (pip install -e '.[bench]')", file=sys.stderr)
        return 2
    return suite.run_cli(a, prog="gridrpc bench")
