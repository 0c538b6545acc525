"""The figure ``accuracy_vs_budget``: accuracy against KV budget per method, over the full cache's."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from snapeval.configs.cache import FULL
from snapeval.figures.panels import NothingToDraw, error_bars, grid, legend, panels, results, save
from snapeval.figures.style import CI_ALPHA, PAPER_RC, method_label, method_style
from snapeval.figures.sweeps import budget_axis, full_cache_line, method_sweeps


def accuracy_vs_budget(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Accuracy against KV budget per method, one panel per experiment, over the full cache's accuracy
    (a dashed line and its band); each method with its 95% band (an error bar at a single budget).

    A method swept over more than its budget is drawn at the setting covering the most budgets.
    """
    return save(draw(df), out, "accuracy_vs_budget")


@mpl.rc_context(PAPER_RC)
def draw(df: pd.DataFrame) -> Figure:
    """The figure of :func:`accuracy_vs_budget`, unsaved."""
    table, experiment, cache = results(df)
    if "cache.budget" not in table or table["cache.budget"].isna().all():
        raise NothingToDraw("no compressed run has a budget")
    drawn = [(title, rows) for title, rows in panels(table, experiment) if rows["cache.budget"].notna().any()]
    fig, axes = grid(len(drawn))
    for ax, (title, rows) in zip(axes, drawn, strict=True):
        full_cache_line(ax, rows[rows["cache.method"] == FULL], "accuracy", band=True)
        compressed = rows[rows["cache.budget"].notna()]
        for method, sweep in method_sweeps(compressed, cache):
            _accuracy_series(ax, sweep, method)
        budget_axis(ax, compressed["cache.budget"])
        ax.set(title=title, ylabel="Accuracy", ylim=(-0.02, 1.02))
    legend(fig, axes)
    return fig


def _accuracy_series(ax: Axes, sweep: pd.DataFrame, method: str) -> None:
    """Accuracy against budget with its interval: a band over two budgets or more, else an error bar."""
    style, label = method_style(method), method_label(method)
    budget, accuracy, low, high = (sweep[key] for key in ("budget_x", "accuracy", "ci_low", "ci_high"))
    if len(sweep) > 1:
        ax.plot(budget, accuracy, label=label, **style)
        ax.fill_between(budget, low, high, color=style["color"], alpha=CI_ALPHA, lw=0)
    else:
        ax.errorbar(budget, accuracy, yerr=error_bars(accuracy, low, high), label=label, **style)
