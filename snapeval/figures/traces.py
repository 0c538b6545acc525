"""The figure ``traces_vs_budget``: trace length and truncation against KV budget per method."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from snapeval.configs.cache import FULL
from snapeval.figures.panels import NothingToDraw, grid, legend, panels, results, save
from snapeval.figures.style import PAPER_RC, method_label, method_style
from snapeval.figures.sweeps import budget_axis, full_cache_line, method_sweeps

#: The two panels of an experiment: the column drawn and its axis label.
MEASURES = (("trace_tokens", "Generated tokens (mean)"), ("truncated", "Truncated share"))


def traces_vs_budget(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Mean trace length and truncation rate (answers that hit ``max_new_tokens``) against KV budget per
    method, over the full cache's, a row of two panels per experiment: does compression lengthen
    reasoning?"""
    return save(draw(df), out, "traces_vs_budget")


@mpl.rc_context(PAPER_RC)
def draw(df: pd.DataFrame) -> Figure:
    """The figure of :func:`traces_vs_budget`, unsaved."""
    table, experiment, cache = results(df)
    has_budget = "cache.budget" in table and table["cache.budget"].notna().any()
    if not has_budget or table["trace_tokens"].isna().all():
        raise NothingToDraw("no compressed run with a budget recorded its traces")
    drawn = [(title, rows) for title, rows in panels(table, experiment) if rows["trace_tokens"].notna().any()]
    fig, axes = grid(len(MEASURES) * len(drawn), columns=len(MEASURES))
    for index, (title, rows) in enumerate(drawn):
        compressed = rows[rows["cache.budget"].notna()]
        sweeps = method_sweeps(compressed, cache)
        row_axes = axes[index * len(MEASURES) : (index + 1) * len(MEASURES)]
        for ax, (column, label) in zip(row_axes, MEASURES, strict=True):
            full_cache_line(ax, rows[rows["cache.method"] == FULL], column)
            for method, sweep in sweeps:
                ax.plot(sweep["budget_x"], sweep[column], label=method_label(method), **method_style(method))
            budget_axis(ax, compressed["cache.budget"])
            ax.set_ylabel(label)
        row_axes[0].set_title(title, loc="left")
        row_axes[1].set_ylim(-0.02, 1.02)
    legend(fig, axes)
    return fig
