"""Side-by-side discovery latency of several shapes of the same size.

On a shared, noisy machine one configuration after another measures the
noise of the moment as much as the shape. Here every shape runs at once and
the discoveries go round-robin, in blocks, from one client to each tree in
turn: the shapes see the same background load. (They also load each other a
little: each idle tree costs its heartbeats, measured and reported.)
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from .measure import CpuMeter, pct, tmpdir
from .tree import Shape, TreeProcs


def compare(n: int, shapes: list[Shape], *, blocks: int = 8, per_block: int = 40, k: int = 3,
            hb: tuple[float, float] = (1.0, 5.0), log=print) -> dict:
    import gridrpc
    trees: list[TreeProcs] = []
    out: dict = {"n": n, "shapes": [s.name for s in shapes], "blocks": blocks, "per_block": per_block}
    try:
        for s in shapes:
            t = TreeProcs(s, n, tmpdir(f"gridrpc-cmp-{s.name}-{n}-"), hb=hb)
            trees.append(t)
            t0 = time.monotonic()
            t.start(timeout=300)
            log(f"  {s.name}: {len(t.procs)} processes, {n} SeDs registered in {time.monotonic() - t0:.1f}s")
        meters = {t.shape.name: CpuMeter(t.pids()) for t in trees}
        for m in meters.values():
            m.start()
        time.sleep(3.0)
        out["idle_cpu"] = {name: sum(m.stop().values()) for name, m in meters.items()}
        lat: dict[str, list[float]] = {t.shape.name: [] for t in trees}
        block_medians: dict[str, list[float]] = {t.shape.name: [] for t in trees}
        errors = {t.shape.name: 0 for t in trees}
        clients = {t.shape.name: gridrpc.Client(t.ma_address, discovery_timeout=10) for t in trees}
        try:
            for c in clients.values():          # warm-up: connections, first discoveries
                for _ in range(10):
                    c.discover("noop", k)
            for b in range(blocks):
                order = list(clients.items()) if b % 2 == 0 else list(reversed(clients.items()))
                for name, c in order:
                    ms = []
                    for _ in range(per_block):
                        t0 = time.perf_counter()
                        try:
                            c.discover("noop", k)
                        except gridrpc.GridRPCError:
                            errors[name] += 1
                            continue
                        ms.append((time.perf_counter() - t0) * 1000)
                    lat[name].extend(ms)
                    block_medians[name].append(statistics.median(ms) if ms else float("nan"))
                log(f"  block {b + 1}/{blocks}: " + ", ".join(
                    f"{nm} {block_medians[nm][-1]:.1f}" for nm in lat) + " ms (medians)")
        finally:
            for c in clients.values():
                c.close()
        out["results"] = {name: {"rounds": len(v), "errors": errors[name], "median_ms": pct(v, 0.5),
                                 "p90_ms": pct(v, 0.9), "p99_ms": pct(v, 0.99), "max_ms": max(v) if v else None,
                                 "block_medians": block_medians[name], "samples": v}
                          for name, v in lat.items()}
    finally:
        for t in reversed(trees):
            t.stop()
    return out


def plot_compare(data: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    res = data["results"]
    names = list(res)
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 3, 4.2))
    ax.boxplot([res[n]["samples"] for n in names], whis=(1, 99), showfliers=False)
    ax.set_xticks(range(1, len(names) + 1))
    ax.set_xticklabels(names)
    for i, n in enumerate(names, 1):
        ax.plot(i, res[n]["p99_ms"], "rv")
        ax.text(i + 0.08, res[n]["p99_ms"], f"p99 {res[n]['p99_ms']:.0f}", fontsize=8, color="red")
    from .plots import target_line
    target_line(ax)
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.set_title(f"{data['n']} SeDs: discovery latency, shapes side by side "
                 f"({data['blocks']}x{data['per_block']} interleaved; whiskers p1-p99)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
