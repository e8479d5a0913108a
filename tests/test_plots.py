"""The report's figures, drawn from the stored JSON results: the 50 ms target
line is labelled, the experiment figures are readable (no tiny fonts)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def texts(fig) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible()]


def test_discovery_plot_labels_the_50_ms_line():
    from benchmarks.scalability.plots import discovery_figure
    data = json.loads((REPO / "benchmarks/scalability/results/latest.json").read_text())
    fig = discovery_figure([r for r in data["runs"] if "error" not in r])
    try:
        lines = [ln for ax in fig.axes for ln in ax.get_lines() if list(ln.get_ydata()) == [50, 50]]
        assert len(lines) == 2 and all("50 ms" in ln.get_label() for ln in lines)
        legend = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
        assert any("50 ms" in t for t in legend)
        assert any("50 ms" in t.get_text() for t in fig.axes[0].texts)       # on the panel without legend
    finally:
        plt.close(fig)


def test_compare_plot_labels_the_50_ms_line(tmp_path):
    from benchmarks.scalability.compare import plot_compare
    data = json.loads((REPO / "benchmarks/scalability/results/compare-500.json").read_text())
    closed = []
    real_close = plt.close
    try:
        plt.close = lambda fig=None: closed.append(fig)
        plot_compare(data, tmp_path / "c.png")
    finally:
        plt.close = real_close
    fig = closed[0]
    try:
        assert any("50 ms" in t.get_text() for t in fig.axes[0].texts)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("scenario", ["day-regular", "night-simultaneous"])
def test_ethic_figures_are_readable(scenario):
    from gridrpc.experiments.plots import figure, load
    fig = figure(scenario, load(str(REPO / "docs/experiments/data")))
    try:
        small = [(t.get_text()[:30], t.get_fontsize()) for t in texts(fig) if t.get_fontsize() < 10]
        assert not small, small
        width, height = fig.get_size_inches()
        assert width <= 13                          # shown at about page width: no shrinking to dots
        labels = " ".join(t.get_text() for t in texts(fig))
        for word in ("legacy", "ethic (paper rule 4)", "unfairness", "min-max"):
            assert word in labels
    finally:
        plt.close(fig)
