"""The figure ``accuracy_vs_memory``: accuracy against KV-cache size, with the Pareto front."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from snapeval.figures.panels import NothingToDraw, error_bars, grid, legend, panels, results, save
from snapeval.figures.style import PAPER_RC, method_label, method_style

PARETO_LABEL = "Pareto front"


def accuracy_vs_memory(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Accuracy against mean KV-cache size (MiB) of every setting, one panel per experiment.

    The Pareto front (no setting is as small and more accurate) is joined by a line and ringed.
    """
    return save(draw(df), out, "accuracy_vs_memory")


def pareto_front(memory: Sequence[float], accuracy: Sequence[float]) -> np.ndarray:
    """Mask of the Pareto-optimal points: no other needs as little memory for as much accuracy or more."""
    memory, accuracy = np.asarray(memory, dtype=float), np.asarray(accuracy, dtype=float)
    on_front = np.zeros(memory.size, dtype=bool)
    best = -np.inf
    for index in np.lexsort((-accuracy, memory)):  # by memory, the most accurate first among equals
        if accuracy[index] > best:
            on_front[index], best = True, accuracy[index]
    return on_front


@mpl.rc_context(PAPER_RC)
def draw(df: pd.DataFrame) -> Figure:
    """The figure of :func:`accuracy_vs_memory`, unsaved."""
    table, experiment, _ = results(df)
    table = table[table["kv_mib"].notna()]
    if table.empty:
        raise NothingToDraw("no sample has kv_bytes")
    drawn = panels(table, experiment)
    fig, axes = grid(len(drawn))
    for ax, (title, rows) in zip(axes, drawn, strict=True):
        for method, points in rows.groupby("cache.method", sort=True):
            style = method_style(method)
            ax.errorbar(
                points["kv_mib"],
                points["accuracy"],
                yerr=error_bars(points["accuracy"], points["ci_low"], points["ci_high"]),
                fmt=style["marker"],
                color=style["color"],
                label=method_label(method),
            )
        front = rows[pareto_front(rows["kv_mib"], rows["accuracy"])].sort_values("kv_mib")
        ax.plot(front["kv_mib"], front["accuracy"], drawstyle="steps-post", color="0.4", lw=0.8, zorder=0)
        ax.scatter(
            front["kv_mib"],
            front["accuracy"],
            s=60,
            facecolors="none",
            edgecolors="0.3",
            lw=0.8,
            clip_on=False,
            label=PARETO_LABEL,
        )
        ax.set_xlim(left=0)
        ax.set(title=title, xlabel="KV cache (MiB, mean per sample)", ylabel="Accuracy", ylim=(-0.02, 1.02))
    legend(fig, axes, last=(PARETO_LABEL,))
    return fig
