"""Plots of ``gridrpc sim validate`` (predicted against measured, log axes,
the ±15 % band): one measurement per tree (:func:`plot`) or several
(:func:`plot_many`). Needs matplotlib; without it nothing is drawn."""
from __future__ import annotations

from pathlib import Path


def _figure():
    """Two side-by-side axes (discovery, throughput), or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt.subplots(1, 2, figsize=(11, 4.5))


def _save(fig, path: Path) -> bool:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return True


def _color(shape: str) -> str:
    return "tab:blue" if shape == "flat" else "tab:orange" if shape.startswith("L2") else "tab:red"


def _diagonal(ax, lo: float, hi: float, xlabel: str, ylabel: str, title: str) -> None:
    """Log axes with the diagonal and its ±15 % band (predicted = measured)."""
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="gray", alpha=0.2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)


def plot_many(res: dict, path: Path) -> bool:
    """Predicted (y) against the measured range (x: a segment from the
    lowest to the highest measurement, a dot per measurement)."""
    made = _figure()
    if made is None:
        return False
    fig, axes = made
    for ax, (key, pk, title) in zip(axes, (("median", "predicted_median_ms", "discovery median (ms)"),
                                           ("rps", "predicted_rps", "calls/s at saturation"))):
        vals = []
        for r in res["rows"]:
            y = r[pk]
            ms = [m["median_ms"] if key == "median" else m["rps"] for m in r["measurements"]]
            ax.plot([min(ms), max(ms)], [y, y], "-", color=_color(r["shape"]), lw=1.2)
            ax.scatter(ms, [y] * len(ms), c=_color(r["shape"]), s=14)
            vals += ms + [y]
        _diagonal(ax, min(vals) * 0.8, max(vals) * 1.2, f"measured {title} ({' / '.join(res['studies'])})",
                  f"simulated {title}", f"{title}: a segment spans a tree's measurements (band ±15 %)")
    return _save(fig, path)


def plot(result: dict, path: Path) -> bool:
    made = _figure()
    if made is None:
        return False
    fig, axes = made
    rows = result["rows"]
    for ax, (mk, pk, title) in zip(axes, (("measured_median_ms", "predicted_median_ms", "discovery median (ms)"),
                                          ("measured_rps", "predicted_rps", "calls/s at saturation"))):
        xs = [r[mk] for r in rows]
        ys = [r[pk] for r in rows]
        ax.scatter(xs, ys, c=[_color(r["shape"]) for r in rows], s=18)
        _diagonal(ax, min(xs + ys) * 0.8, max(xs + ys) * 1.2, f"measured {title}", f"simulated {title}",
                  f"{title}: blue flat, orange L2, red L3 (band ±15 %)")
    return _save(fig, path)
