"""Plots and tables of the sweep (:mod:`gridrpc.experiments.sweep`).

``python -m gridrpc.experiments.plots DATADIR OUTDIR`` writes one PNG per
scenario (unhappy users, unfairness, completed requests: legacy over
n_submit, ethic as horizontal lines) and prints markdown tables.
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


def plot(data: dict[str, dict], outdir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    for sc in SCENARIOS:
        leg = [(ns, data.get(f"{sc}.legacy-{ns}")) for ns in N_SUBMIT]
        leg = [(ns, d) for ns, d in leg if d]
        if not leg:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        for ax, (key, label) in zip(axes, METRICS):
            xs = [ns for ns, _ in leg]
            med = [_spread(d, key) for _, d in leg]
            ax.errorbar(xs, [m[0] for m in med], yerr=[[m[0] - m[1] for m in med], [m[2] - m[0] for m in med]],
                        fmt="o-", color="tab:blue", capsize=3, label="legacy (FCFS, n_submit)")
            for suffix, lab, color in ETHIC:
                d = data.get(f"{sc}.{suffix}")
                if d:
                    m, lo, hi = _spread(d, key)
                    ax.axhline(m, color=color, ls="--", label=f"{lab}: {m:.3g}")
                    ax.axhspan(lo, hi, color=color, alpha=0.12)
            ax.set_xscale("log")
            if key == "unfairness":
                ax.set_yscale("symlog", linthresh=0.05)
                ax.set_ylim(bottom=0)
            ax.set_xlabel("n_submit (legacy clients)")
            ax.set_title(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"{sc}: 10 SeDs, 10 clients, T = 1, d = 100, n_min 3, n_max 1000 "
                     f"(time scale {leg[0][1]['config']['time_scale']:g}; medians, bars/bands min-max)",
                     fontsize=9)
        fig.tight_layout()
        path = os.path.join(outdir, f"ethic-{sc}.png")
        fig.savefig(path, dpi=90)
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
