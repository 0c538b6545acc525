"""What every figure shares: samples grouped into panels (one per experiment), the grid of panel axes,
one legend below them that fits the figure, and saving as PDF and PNG.

A panel is one experiment: one setting of everything outside the cache (model, task and its parameters,
generation, seed), titled by its task and the settings that set it apart from the other panels.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend import Legend

from snapeval.errors import SnapevalError
from snapeval.figures.style import PAPER_RC, format_value, short_name
from snapeval.results import config_columns, hashable, summarize
from snapeval.results.files import write_atomically

PANEL_SIZE = (2.6, 2.1)  # inches per panel
MAX_COLUMNS = 3
MAX_LEGEND_COLUMNS = 5
LEGEND_PAD = 0.08  # inches between the panels and the legend


class NothingToDraw(SnapevalError):
    """The samples hold no data for a figure; the message says what is missing."""


def settings(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str], list[str]]:
    """``df`` with hashable config values, and its config columns outside and inside the cache."""
    if df.empty:
        raise NothingToDraw("no samples stored")
    config = config_columns(df)
    df = df.assign(**{column: df[column].map(hashable) for column in config})
    cache = [column for column in config if column.startswith("cache.")]
    return df, [column for column in config if column not in cache], cache


def results(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Accuracy and KV size per setting, with the experiment and cache columns of :func:`settings`."""
    df, experiment, cache = settings(df)
    return summarize(df, experiment + cache), experiment, cache


def panels(table: pd.DataFrame, experiment: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """``(title, rows)`` per experiment: its task, and the settings that set it apart from the others."""
    if not experiment:
        return [("", table)]
    groups = list(table.groupby(experiment, dropna=False, sort=True))
    keys = pd.DataFrame([key for key, _ in groups], columns=experiment)
    tasks = keys["task.name"] if "task.name" in keys else pd.Series("", index=keys.index)
    titles = [
        ", ".join([str(task), *apart])
        for task, apart in zip(tasks, differences(keys, skip=("task.name",)), strict=True)
    ]
    return [(title, rows) for title, (_, rows) in zip(titles, groups, strict=True)]


def differences(keys: pd.DataFrame, skip: Collection[str] = ()) -> list[list[str]]:
    """Per row of ``keys``, ``name=value`` for each column (but ``skip``) whose value differs between rows."""
    varying = [
        column for column in keys.columns if column not in skip and keys[column].nunique(dropna=False) > 1
    ]
    return [
        [f"{short_name(column)}={format_value(row[column])}" for column in varying]
        for _, row in keys.iterrows()
    ]


def error_bars(accuracy: pd.Series, low: pd.Series, high: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(below, above) distances to the interval's ends, never negative (Wilson's ends can round past p)."""
    return np.clip(accuracy - low, 0, None), np.clip(high - accuracy, 0, None)


def grid(panels: int, columns: int = MAX_COLUMNS) -> tuple[Figure, list[Axes]]:
    """A figure of ``panels`` axes, at most ``columns`` a row, each :data:`PANEL_SIZE`; unused cells are
    hidden."""
    columns = min(panels, columns)
    rows = -(-panels // columns)
    fig = Figure(figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows), layout="constrained")
    axes = list(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def legend(fig: Figure, axes: list[Axes], last: Collection[str] = ()) -> Legend | None:
    """One legend below the panels, with every label of any panel once (those in ``last`` at the end).

    It takes as many columns as fit the figure's width, and the figure grows by its height, so the
    panels keep their size.
    """
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if not entries:
        return None
    labels = sorted(entries, key=lambda label: label in last)
    handles = [entries[label] for label in labels]
    for columns in range(min(len(labels), MAX_LEGEND_COLUMNS), 0, -1):
        box = fig.legend(handles, labels, loc="outside lower center", ncols=columns)
        if columns == 1 or box.get_window_extent().width <= fig.bbox.width:
            break
        box.remove()
    fig.set_figheight(fig.get_figheight() + box.get_window_extent().height / fig.dpi + LEGEND_PAD)
    return box


def figure_paths(out: str | os.PathLike[str], name: str) -> list[Path]:
    """The files of the figure ``name`` in the folder ``out``: ``<name>.pdf`` and ``.png``."""
    return [Path(out) / f"{name}.{extension}" for extension in ("pdf", "png")]


def save(fig: Figure, out: str | os.PathLike[str], name: str) -> list[Path]:
    """``fig`` as ``<out>/<name>.pdf`` and ``.png`` (the folder made if missing), each written whole or
    not at all; the paths."""
    Path(out).mkdir(parents=True, exist_ok=True)
    paths = figure_paths(out, name)
    with mpl.rc_context(PAPER_RC):
        for path in paths:
            with write_atomically(path, binary=True) as file:
                fig.savefig(file, format=path.suffix.removeprefix("."))
    return paths
