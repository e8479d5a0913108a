"""A data reference fetched SeD to SeD: plain, over CURVE alone, and through a bulk session.

Three trees run together in this process (``LocalTree``: MA -> sed-ma-1 and
sed-ma-2, real sockets, each tree on its own loop thread): a client puts an
array on sed-ma-1, then sed-ma-2 fetches it (``SedData.fetch``, what a call
taking the reference as an argument does) ``--repeats`` times per round, the
trees alternating fetch by fetch so that they share the load. ``curve`` is
the secure tree with its fetches' bulk sessions turned off (CURVE alone),
``sealed`` the secure tree as it runs. Each round starts with the fetching
SeD's pipes to the holder closed: its first fetch (the pipe opened, and in
``sealed`` the session) is shown apart.

    python -m benchmarks.s2s_bulk [--mb 8] [--repeats 5] [--rounds 3]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time

import numpy as np

import gridrpc
from gridrpc.core.refs import RefTag
from gridrpc.testing import LocalTree

USER = "bench"
MODES = ("plain", "curve", "sealed")


class _Tree:
    """One tree, the reference put on its holder, and the SeD that fetches it."""

    def __init__(self, mode: str, stack: contextlib.ExitStack, tmp: str, a: np.ndarray) -> None:
        keys = None if mode == "plain" else tempfile.mkdtemp(dir=tmp)
        self.t = stack.enter_context(LocalTree(las=0, seds_under_ma=2, keys=keys, users=[USER], http=False))
        holder, self.runner = self.t.seds
        self.pipes = self.runner.data.pipes
        if mode == "curve":
            self.t.lt.call(lambda: setattr(self.pipes, "links", None))     # every fetch over CURVE
        kw = {"keys": keys} if keys else {}
        with gridrpc.Client(self.t.ma_address, user=USER, **kw) as c:
            self.desc = c.put(a, server=holder.name).__gridrpc_ref__()
        self.nbytes = a.nbytes

    def close_pipes(self) -> None:
        def close():
            for address in list(self.pipes):
                self.pipes.close_one(address)
        self.t.lt.call(close)

    def fetch_ms(self) -> float:
        async def one():
            t0 = time.perf_counter()
            _tree, buffers = await self.runner.data.fetch(RefTag(dict(self.desc)), USER)
            ms = (time.perf_counter() - t0) * 1e3
            if sum(len(b) for b in buffers) != self.nbytes:
                raise AssertionError(f"fetched {sum(len(b) for b in buffers)} bytes, not {self.nbytes}")
            return ms
        return self.t.lt.run(one(), timeout=60)

    def sealed_answers(self) -> int:
        return self.t.lt.call(lambda: self.pipes.links.stats["received"] if self.pipes.links else 0)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5, help="fetches per round after the first")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    arr = np.random.default_rng(0).random((a.mb << 20) // 8)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        trees = {mode: _Tree(mode, stack, tmp, arr) for mode in MODES}
        for r in range(a.rounds):
            ms: dict = {mode: [] for mode in MODES}
            sealed0 = trees["sealed"].sealed_answers()
            for tree in trees.values():
                tree.close_pipes()
            for _ in range(1 + a.repeats):
                for mode, tree in trees.items():
                    ms[mode].append(tree.fetch_ms())
            med = {mode: statistics.median(v[1:]) if len(v) > 1 else v[0] for mode, v in ms.items()}
            parts = [f"{mode} first {v[0]:.1f} ms, median {med[mode]:.1f} (min {min(v[1:] or v):.1f})"
                     for mode, v in ms.items()]
            print(f"round {r + 1} ({a.mb} MB): " + "; ".join(parts)
                  + f": sealed/curve {med['sealed'] / med['curve']:.2f}x, sealed/plain "
                  f"{med['sealed'] / med['plain']:.2f}x; sealed answers "
                  f"{trees['sealed'].sealed_answers() - sealed0}/{1 + a.repeats}", flush=True)


if __name__ == "__main__":
    main()
