"""The figure ``accuracy_per_turn``: for samples that ask several questions of one context, each turn's
accuracy against KV budget per method, over the full cache's at that turn.

A row of panels per experiment and compression mode (query-aware first, the mode of a run that sets no
``task.compression``), a panel per turn: a method that matches the full cache at turn 1 and falls below
its dashed line from turn 2 on lost, in compressing, what the later questions needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from snapeval.configs.task import COMPRESSION_MODES
from snapeval.figures.panels import NothingToDraw, grid, legend, panels, save, settings
from snapeval.figures.style import PAPER_RC
from snapeval.figures.sweeps import accuracy_panel
from snapeval.stats.turns import TURN_METRIC, per_turn

COMPRESSION = "task.compression"
DEFAULT_COMPRESSION = COMPRESSION_MODES[0]
"""The compression mode of a run that sets no ``task.compression``: query-aware."""
METRIC = "metric."


def accuracy_per_turn(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Each turn's accuracy against KV budget per method with its 95% band (an error bar at a single
    budget), over the full cache's at that turn (a dashed line and its band): a row of panels per
    experiment and compression mode, a panel per turn."""
    return save(draw(df), out, "accuracy_per_turn")


def turn_table(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Per setting of the multi-turn samples (those with ``metric.turn_1``) and per turn it asked: the
    turn's ``accuracy``, ``ci_low``, ``ci_high`` and ``n`` (:func:`snapeval.stats.turns.per_turn`), with
    the experiment columns (``task.compression`` filled with its default) and the cache columns."""
    if f"{METRIC}turn_1" not in df or df[f"{METRIC}turn_1"].isna().all():
        raise NothingToDraw("no sample asks several questions (metric.turn_1)")
    multi = df[df[f"{METRIC}turn_1"].notna()]
    modes = multi[COMPRESSION].fillna(DEFAULT_COMPRESSION) if COMPRESSION in multi else DEFAULT_COMPRESSION
    multi, experiment, cache = settings(multi.assign(**{COMPRESSION: modes}))
    turns = [name for name in multi if name.startswith(METRIC) and TURN_METRIC.fullmatch(name[len(METRIC) :])]
    keys = experiment + cache
    rows = []
    for key, group in multi.groupby(keys, dropna=False, sort=True):
        metrics = [
            {name.removeprefix(METRIC): value for name, value in sample.items() if pd.notna(value)}
            for sample in group[turns].to_dict("records")
        ]
        for turn in per_turn(metrics):
            values = {"accuracy": turn.mean, "ci_low": turn.low, "ci_high": turn.high, "n": turn.n}
            rows.append({**dict(zip(keys, key, strict=True)), "turn": turn.turn, **values})
    return pd.DataFrame(rows), experiment, cache


@mpl.rc_context(PAPER_RC)
def draw(df: pd.DataFrame) -> Figure:
    """The figure of :func:`accuracy_per_turn`, unsaved."""
    table, experiment, cache = turn_table(df)
    if "cache.budget" not in table or table["cache.budget"].isna().all():
        raise NothingToDraw("no compressed multi-turn run has a budget")
    others = [column for column in experiment if column != COMPRESSION]
    rows = [
        (", ".join(filter(None, (title, str(mode)))), part)
        for title, experiment_rows in panels(table, others)
        for mode, part in sorted(
            experiment_rows.groupby(COMPRESSION, sort=True), key=lambda item: item[0] != DEFAULT_COMPRESSION
        )
        if part["cache.budget"].notna().any()
    ]
    width = int(table["turn"].max())
    fig, axes = grid(len(rows) * width, columns=width)
    drawn = []
    for index, (title, part) in enumerate(rows):
        for turn, ax in enumerate(axes[index * width : (index + 1) * width], start=1):
            at_turn = part[part["turn"] == turn]
            if at_turn["cache.budget"].isna().all():  # no compressed setting asked this turn
                ax.set_visible(False)
                continue
            accuracy_panel(ax, at_turn, cache)
            ax.set_title(f"{title}\nturn {turn}")
            drawn.append(ax)
    legend(fig, drawn)
    return fig
