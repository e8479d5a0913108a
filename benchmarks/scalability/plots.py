"""PNG plots of the scalability study (matplotlib, Agg backend).

``python -m benchmarks.scalability.plots`` redraws every PNG of
``docs/scalability/`` from the stored JSON results (nothing is rerun):
``latest.json`` (the study), ``contended-run.json`` (its discovery plot under
background load) and ``compare-500.json`` (shapes side by side).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .measure import discovery_cost  # noqa: E402

FAMILIES = [("flat", "flat (all SeDs under the MA)"), ("L2-2", "2 levels, 2 LAs"),
            ("L2-4", "2 levels, 4 LAs"), ("L2-sqrt", "2 levels, d = sqrt(N) LAs"),
            ("L3-2", "3 levels, d = 2"), ("L3-cbrt", "3 levels, d = cbrt(N) (complete d-ary)")]


def family(r: dict) -> str:
    s = r["shape"]
    if s in ("flat", "L2-2", "L2-4", "L3-2"):
        return s
    if r["levels"] == 2:
        return "L2-sqrt"
    return "L3-cbrt"


def _series(runs, key):
    out: dict[str, list] = {}
    for r in sorted(runs, key=lambda r: r["n"]):
        v = key(r)
        if v is not None:
            out.setdefault(family(r), []).append((r["n"], v, r["shape"]))
    return out


def plot_all(data: dict, outdir: Path) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    runs = [r for r in data["runs"] if "error" not in r]
    paths = [_discovery(runs, outdir / "discovery.png"), _throughput(runs, outdir / "throughput.png"),
             _cpu(runs, outdir / "cpu.png"), _cost(runs, outdir / "discovery-cost.png")]
    largest = max((r["n"] for r in runs), default=None)
    if largest is not None:
        paths.append(_curves([r for r in runs if r["n"] == largest], outdir / f"load-{largest}.png", largest))
    return [p for p in paths if p]


def _labels():
    return dict(FAMILIES)


TARGET_MS = 50
TARGET_LABEL = f"target: p99 \u2264 {TARGET_MS} ms"


def target_line(ax, annotate: bool = True) -> None:
    """The dotted 50 ms line, labelled in the legend (if any) and, with
    ``annotate``, on the plot itself."""
    ax.axhline(TARGET_MS, color="grey", ls=":", lw=1.2, label=TARGET_LABEL)
    if annotate:
        ax.annotate(TARGET_LABEL, xy=(0.01, TARGET_MS), xycoords=("axes fraction", "data"), ha="left",
                    va="bottom", fontsize=9, color="dimgrey",
                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})


def discovery_figure(runs):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, key, title in ((axes[0], "median_ms", "median"), (axes[1], "p99_ms", "p99")):
        for fam, pts in _series(runs, lambda r: r.get("discovery", {}).get(key)).items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=_labels().get(fam, fam))
        target_line(ax, annotate=ax is axes[0])        # the right panel has the legend
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("SeDs")
        ax.set_title(f"discovery latency, {title} (one client, sequential)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def _discovery(runs, path: Path) -> Path:
    fig = discovery_figure(runs)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _throughput(runs, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for fam, pts in _series(runs, lambda r: r.get("saturation", {}).get("max_rps")).items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=_labels().get(fam, fam))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("SeDs")
    ax.set_ylabel("calls/s (each with its discovery)")
    ax.set_title("saturation throughput under locust load")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cpu(runs, path: Path) -> Path:
    rs = sorted(runs, key=lambda r: (r["n"], r["levels"], r["d"]))
    rs = [r for r in rs if r.get("saturation")]
    fig, ax = plt.subplots(figsize=(max(7, 0.45 * len(rs)), 4.5))
    bottom = [0.0] * len(rs)
    for kind, color in (("MA", "tab:red"), ("LAs", "tab:orange"), ("SeDs", "tab:blue"), ("locust", "tab:grey")):
        vals = [r["saturation"]["cpu_by_kind"].get(kind, 0.0) for r in rs]
        ax.bar(range(len(rs)), vals, bottom=bottom, color=color, label=kind)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(200, color="black", ls=":", lw=1)
    ax.text(0, 203, "2 cores", fontsize=8)
    ax.set_xticks(range(len(rs)))
    ax.set_xticklabels([f"{r['n']}\n{r['shape']}" for r in rs], fontsize=7)
    ax.set_ylabel("CPU % of one core")
    ax.set_title("CPU at the saturation point, by element kind")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


KINDS = (("MA", "tab:red"), ("LAs", "tab:orange"), ("SeDs", "tab:blue"))


def _cost(runs, path: Path) -> Path:
    rs = [r for r in sorted(runs, key=lambda r: (r["n"], r["levels"], r["d"])) if discovery_cost(r)]
    fig, ax = plt.subplots(figsize=(max(7, 0.45 * len(rs)), 4.5))
    bottom = [0.0] * len(rs)
    for kind, color in KINDS:
        vals = [discovery_cost(r)[kind] for r in rs]
        ax.bar(range(len(rs)), vals, bottom=bottom, color=color, label=kind)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(range(len(rs)), [r["discovery"]["mean_ms"] for r in rs], "k_", ms=14, mew=2,
            label="wall time of one discovery")
    ax.set_xticks(range(len(rs)))
    ax.set_xticklabels([f"{r['n']}\n{r['shape']}" for r in rs], fontsize=7)
    ax.set_ylabel("ms")
    ax.set_title("CPU time one discovery costs, by element kind (sequential discoveries)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _curves(runs, path: Path, n: int) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in sorted(runs, key=lambda r: (r["levels"], r["d"])):
        steps = [s for s in r.get("load", []) if "rps" in s]
        if not steps:
            continue
        axes[0].plot([s["users"] for s in steps], [s["rps"] for s in steps], marker="o", label=r["shape"])
        axes[1].plot([s["rps"] for s in steps], [s["p99_ms"] or 0 for s in steps], marker="o", label=r["shape"])
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("locust users")
    axes[0].set_ylabel("calls/s")
    axes[0].set_title(f"{n} SeDs: throughput vs users")
    axes[1].set_xlabel("calls/s")
    axes[1].set_ylabel("call p99, ms")
    axes[1].set_yscale("log")
    axes[1].set_title(f"{n} SeDs: latency vs throughput")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "scalability" / "results"
DOCS = ROOT / "docs" / "scalability"


def redraw(results: Path = RESULTS, outdir: Path = DOCS) -> list[Path]:
    """Every PNG of the study from the stored JSON (no measurement)."""
    paths = plot_all(json.loads((results / "latest.json").read_text()), outdir)
    contended = results / "contended-run.json"
    if contended.exists():
        runs = [r for r in json.loads(contended.read_text())["runs"] if "error" not in r]
        paths.append(_discovery(runs, outdir / "discovery-contended.png"))
    for compare in sorted(results.glob("compare-*.json")):
        if compare.stem.endswith("-contended"):
            continue                       # not shown in docs/scalability.md
        from .compare import plot_compare
        paths.append(plot_compare(json.loads(compare.read_text()), outdir / f"{compare.stem}.png"))
    return paths


if __name__ == "__main__":
    for p in redraw(*(Path(a) for a in sys.argv[1:3])):
        print(f"plot: {p}")
