"""Plots and tables of the sweep (:mod:`gridrpc.experiments.sweep`).

``python -m gridrpc.experiments.plots DATADIR OUTDIR`` writes one PNG per
scenario (unhappy users, unfairness, completed requests: legacy over
n_submit, ethic as horizontal lines) and prints markdown tables. The stored
results redraw the report's figures without rerunning anything::

    python -m gridrpc.experiments.plots docs/experiments/data docs/experiments
"""
from __future__ import annotations

import glob
import json
import os
import sys

from ..core.scenarios import SCENARIOS
from .sweep import N_SUBMIT

METRICS = (("unhappy_users", "unhappy users"), ("unfairness", "unfairness"),
           ("completed", "completed requests"))
ETHIC = (("ethic-cumulative", "ethic (paper rule 4)", "tab:red"),
         ("ethic-virtual", "ethic, accounting=virtual", "tab:green"))


def load(datadir: str) -> dict[str, dict]:
    out = {}
    for path in glob.glob(os.path.join(datadir, "*.json")):
        name = os.path.basename(path)[:-5]
        with open(path) as fh:
            out[name] = json.load(fh)
    return out


def _spread(d: dict, key: str) -> tuple[float, float, float]:
    vals = [r[key] for r in d["runs"]]
    return d[key], min(vals), max(vals)


#: font sizes (points): the PNGs are read scaled down in a browser
FONTS = {"font.size": 12, "axes.titlesize": 14, "axes.labelsize": 12, "xtick.labelsize": 11,
         "ytick.labelsize": 11, "legend.fontsize": 11, "figure.titlesize": 14}


def figure(sc: str, data: dict[str, dict]):
    """The figure of one scenario (None without legacy data): three panels
    (unhappy users, unfairness, completed requests; legacy over n_submit,
    ethic as horizontal lines with their min-max band) and a fourth holding
    the legend and the ethic values, so nothing covers the data."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    leg = [(ns, data.get(f"{sc}.legacy-{ns}")) for ns in N_SUBMIT]
    leg = [(ns, d) for ns, d in leg if d]
    if not leg:
        return None
    with plt.rc_context(FONTS):
        fig, grid = plt.subplots(2, 2, figsize=(12, 8.4))
        panels, key_ax = [grid[0][0], grid[0][1], grid[1][0]], grid[1][1]
        values: list[str] = []
        for ax, (key, label) in zip(panels, METRICS):
            xs = [ns for ns, _ in leg]
            med = [_spread(d, key) for _, d in leg]
            ax.errorbar(xs, [m[0] for m in med], yerr=[[m[0] - m[1] for m in med], [m[2] - m[0] for m in med]],
                        fmt="o-", color="tab:blue", capsize=4, lw=2, ms=7)
            row = []
            for suffix, lab, color in ETHIC:
                d = data.get(f"{sc}.{suffix}")
                if d:
                    m, lo, hi = _spread(d, key)
                    ax.axhline(m, color=color, ls="--", lw=2)
                    ax.axhspan(lo, hi, color=color, alpha=0.15)
                    row.append(f"{m:.0f}" if abs(m) >= 100 else f"{m:.3g}")
            values.append(f"{label}: " + " / ".join(row))
            ax.set_xscale("log")
            if key == "unfairness":
                ax.set_yscale("symlog", linthresh=0.05)
                ax.set_ylim(bottom=0)
            ax.set_xlabel("n_submit (legacy clients)")
            ax.set_title(label)
            ax.grid(alpha=0.3)
        key_ax.axis("off")
        handles = [Line2D([], [], color="tab:blue", marker="o", lw=2, label="legacy (FCFS, n_submit requests)")]
        for suffix, lab, color in ETHIC:
            if data.get(f"{sc}.{suffix}"):
                handles.append(Line2D([], [], color=color, ls="--", lw=2, label=lab))
        handles.append(Patch(color="grey", alpha=0.25, label="band / bars: min-max over runs"))
        key_ax.legend(handles=handles, loc="upper left", frameon=False, title="medians over runs",
                      title_fontsize=12)
        ethic_names = " / ".join(lab for suffix, lab, _ in ETHIC if data.get(f"{sc}.{suffix}"))
        key_ax.text(0.0, 0.38, f"ethic values ({ethic_names}):\n" + "\n".join("  " + v for v in values),
                    transform=key_ax.transAxes, va="top", fontsize=11)
        cfg = leg[0][1]["config"]
        fig.suptitle(f"{sc}: {cfg['seds']} SeDs, {cfg['clients']} clients, T = {cfg['task_time']:g}, "
                     f"d = {cfg['deadline']:g}, n_min {cfg['n_min']}, n_max {cfg['n_max']} "
                     f"(time scale {cfg['time_scale']:g})")
        fig.tight_layout()
    return fig


def plot(data: dict[str, dict], outdir: str) -> list[str]:
    import matplotlib.pyplot as plt
    written = []
    for sc in SCENARIOS:
        fig = figure(sc, data)
        if fig is None:
            continue
        path = os.path.join(outdir, f"ethic-{sc}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def table(data: dict[str, dict]) -> str:
    rows = ["| scenario | client | unhappy | unfairness | completed | killed (s of work) | runs |",
            "|---|---|---|---|---|---|---|"]
    for sc in [*SCENARIOS, "scale"]:
        names = [f"{sc}.{s}" for s, _, _ in ETHIC] + [f"{sc}.legacy-{ns}" for ns in N_SUBMIT] + \
            sorted(n for n in data if n.startswith(f"{sc}.ethic-virtual-"))
        for n in names:
            d = data.get(n)
            if not d:
                continue
            u = _spread(d, "unhappy_users")
            f = _spread(d, "unfairness")
            c = _spread(d, "completed")
            rows.append(f"| {sc} | {n.split('.', 1)[1]} | {u[0]:g} | {f[0]:.3f} ({f[1]:.3f}–{f[2]:.3f}) | "
                        f"{c[0]:g} ({c[1]:g}–{c[2]:g}) | {d['killed_seconds']:.1f} | {len(d['runs'])} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    datadir, outdir = argv[0], argv[1] if len(argv) > 1 else argv[0]
    data = load(datadir)
    for p in plot(data, outdir):
        print("wrote", p, file=sys.stderr)
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
