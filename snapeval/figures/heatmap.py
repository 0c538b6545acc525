"""The figure ``window_kernel_heatmap``: accuracy over observation window x pooling kernel."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from snapeval.figures.panels import NothingToDraw, differences, grid, panels, results, save
from snapeval.figures.style import PAPER_RC, format_value, setting_label

AXES = ("cache.window", "cache.kernel")


def window_kernel_heatmap(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Accuracy over observation window x pooling kernel, one panel per method, budget and experiment;
    each cell shows the accuracy, its 95% interval and n.

    A panel needs at least two windows and two kernels under otherwise equal settings.
    """
    return save(draw(df), out, "window_kernel_heatmap")


@mpl.rc_context(PAPER_RC)
def draw(df: pd.DataFrame) -> Figure:
    """The figure of :func:`window_kernel_heatmap`, unsaved."""
    table, experiment, cache = results(df)
    if not set(AXES) <= set(cache):
        raise NothingToDraw("no run has a window and a kernel")
    fixed = [column for column in cache if column not in AXES]
    grids = [
        (title, setting)
        for title, rows in panels(table, experiment)
        for _, setting in rows.groupby(fixed, dropna=False, sort=True)
        if all(setting[column].nunique() >= 2 for column in AXES)
    ]
    if not grids:
        raise NothingToDraw("no setting was run at two or more windows and two or more kernels")
    settings = pd.DataFrame([setting.iloc[0][fixed] for _, setting in grids])
    apart = differences(settings, skip=("cache.method", "cache.budget"))
    headings = [
        ", ".join([setting_label(row), *rest])
        for (_, row), rest in zip(settings.iterrows(), apart, strict=True)
    ]
    fig, axes = grid(len(grids))
    for ax, (title, setting), heading in zip(axes, grids, headings, strict=True):
        image = _cells(ax, setting)
        ax.set(title=f"{heading}\n{title}", xlabel="Kernel", ylabel="Window")
    fig.colorbar(image, ax=axes, label="Accuracy", shrink=0.8)
    return fig


def _cells(ax: Axes, setting: pd.DataFrame) -> AxesImage:
    """One cell per window and kernel of ``setting``, coloured by accuracy, with its interval and n."""
    cells = {
        values: setting.pivot(index=AXES[0], columns=AXES[1], values=values)
        for values in ("accuracy", "ci_low", "ci_high", "n")
    }
    accuracy = cells["accuracy"]
    low, high, n = (cells[values].to_numpy() for values in ("ci_low", "ci_high", "n"))
    image = ax.imshow(accuracy.to_numpy(), vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
    for (row, column), value in np.ndenumerate(accuracy.to_numpy()):
        if not np.isnan(value):
            interval = f"[{low[row, column]:.2f}, {high[row, column]:.2f}]"
            color = "black" if value > 0.6 else "white"
            text = f"{value:.2f}\n{interval}\nn={n[row, column]:.0f}"
            ax.text(column, row, text, ha="center", va="center", color=color, fontsize=5)
    ax.set_xticks(range(accuracy.shape[1]), [format_value(kernel) for kernel in accuracy.columns])
    ax.set_yticks(range(accuracy.shape[0]), [format_value(window) for window in accuracy.index])
    ax.grid(False)
    return image
