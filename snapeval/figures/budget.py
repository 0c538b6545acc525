"""The figure ``accuracy_vs_budget``: accuracy against KV budget per method, over the full cache's."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from snapeval.figures.panels import NothingToDraw, grid, legend, panels, results, save
from snapeval.figures.style import PAPER_RC
from snapeval.figures.sweeps import accuracy_panel


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
        accuracy_panel(ax, rows, cache)
        ax.set_title(title)
    legend(fig, axes)
    return fig
