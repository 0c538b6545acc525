"""The report's figure per experiment: accuracy and paired retention against KV budget, a line per series
with its 95% interval (retention: its one-sided 95% bounds), over the full cache's accuracy and the
retention targets; drawn as SVG."""

from __future__ import annotations

import io
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from snapeval.configs.cache import FULL
from snapeval.report.analysis import Comparison
from snapeval.report.data import Experiment
from snapeval.stats import mean_ci

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: Matplotlib settings of the report's figures: screen-sized text kept as text (small SVG, no font files).
REPORT_RC: dict[str, object] = {
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.5,
    "lines.linewidth": 1.3,
    "lines.markersize": 4,
    "legend.frameon": False,
    "svg.fonttype": "none",
    "svg.hashsalt": "snapeval-report",
}
BAND_ALPHA = 0.18


def budget_figure(
    experiment: Experiment,
    comparisons: dict[str, Comparison],
    full_accuracy: tuple[float, float, float],
    targets: tuple[float, ...],
) -> bytes | None:
    """The SVG of accuracy (left) and paired retention (right) against budget; None when no compressed
    setting of the experiment has a budget and a score."""
    import matplotlib  # only for the HTML report: its figures
    from matplotlib.figure import Figure

    from snapeval.figures.style import DASHES, MARKERS, method_style

    drawn = [
        (series, [s for s in series.settings if s.size and s.size[0] == "budget" and s.scores()])
        for series in experiment.series
    ]
    drawn = [(series, settings) for series, settings in drawn if settings]
    if not drawn:
        return None
    with matplotlib.rc_context(REPORT_RC):
        fig = Figure(figsize=(8.0, 3.0), layout="constrained")
        left, right = fig.subplots(1, 2)
        mean, low, high = full_accuracy
        if not math.isnan(mean):
            full = method_style(FULL)
            left.axhline(mean, color=full["color"], linestyle=full["linestyle"], lw=1, label="Full cache")
            if not math.isnan(low):
                left.axhspan(low, high, color=full["color"], alpha=BAND_ALPHA / 2, lw=0)
        for target in targets:
            right.axhline(target, color="#555555", linestyle=":", lw=0.9)
            right.annotate(f"{target:g}", (1.0, target), xycoords=("axes fraction", "data"), fontsize=7)
        repeats: Counter[str] = Counter()
        budgets: set[float] = set()
        for series, settings in drawn:
            style = method_style(series.method)
            if repeats[series.method]:  # another series of the same method: its own dashes and marker
                index = repeats[series.method]
                style = {**style, "linestyle": DASHES[index % len(DASHES)], "marker": MARKERS[-index]}
            repeats[series.method] += 1
            x = [s.size[1] for s in settings]
            budgets.update(x)
            accuracy = [mean_ci(s.scores().values()) for s in settings]
            _line(left, x, accuracy, style, series.label)
            _line(right, x, [comparisons[s.digest].retention for s in settings], style, series.label)
        for ax, label in ((left, "Accuracy"), (right, "Retention (paired)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(budgets), [f"{b:g}" for b in sorted(budgets)])
            ax.minorticks_off()
            ax.set(xlabel="KV budget (tokens)", ylabel=label)
        left.set_ylim(-0.02, 1.02)
        handles, labels = left.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize=8)
        out = io.BytesIO()
        fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    return out.getvalue()


def _line(
    ax: Axes, x: list[float], points: list[tuple[float, float, float]], style: dict[str, Any], label: str
) -> None:
    """``points`` ``(value, low, high)`` against ``x``: a line and band, or an error bar for one point."""
    values = [p[0] for p in points]
    low = [p[1] if not math.isnan(p[1]) else p[0] for p in points]
    high = [p[2] if not math.isnan(p[2]) else p[0] for p in points]
    if len(points) > 1:
        ax.plot(x, values, label=label, **style)
        ax.fill_between(x, low, high, color=style["color"], alpha=BAND_ALPHA, lw=0)
    else:
        errors = [[values[0] - low[0]], [high[0] - values[0]]]
        ax.errorbar(x, values, yerr=errors, label=label, capsize=2, **style)
