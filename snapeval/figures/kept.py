"""The figure ``kept_positions``: the share of each region of the prompt that a method keeps."""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from snapeval.figures.panels import NothingToDraw, grid, legend, panels, save, settings
from snapeval.figures.style import CI_ALPHA, DASHES, PAPER_RC, method_color, setting_label


@dataclass(frozen=True)
class KeptSeries:
    """Share of the prompt kept per relative-position bin, for one method at one budget.

    ``mean`` averages the cache settings run at that budget (windows, kernels, ...), each the mean of its
    samples; ``low``/``high`` are the least and most any of them kept (equal to ``mean`` for one setting).
    """

    method: str
    label: str
    edges: list[float]
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    settings: int


def kept_series(rows: pd.DataFrame, cache: list[str]) -> list[KeptSeries]:
    """One :class:`KeptSeries` per method and budget of ``rows`` (samples with a ``kept_histogram``)."""
    sizes = [column for column in ("cache.budget", "cache.ratio") if column in rows.columns]
    series = []
    for (method, *_), same_size in rows.groupby(["cache.method", *sizes], dropna=False, sort=True):
        per_setting = np.array(
            [
                np.mean([histogram["counts"] for histogram in setting["kept_histogram"]], axis=0)
                for _, setting in same_size.groupby(cache, dropna=False, sort=True)
            ]
        )
        series.append(
            KeptSeries(
                method=method,
                label=setting_label(same_size.iloc[0]),
                edges=same_size["kept_histogram"].iloc[0]["bins"],
                mean=per_setting.mean(axis=0),
                low=per_setting.min(axis=0),
                high=per_setting.max(axis=0),
                settings=len(per_setting),
            )
        )
    return series


def kept_positions(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Share of prompt positions kept per relative-position bin: a line per method and budget, and a band
    over the settings run at that budget (windows, kernels, ...) when there are several; a panel per
    experiment.

    Reads ``extra["kept_histogram"]`` of each sample: ``{"bins": [...], "counts": [...]}``, the
    ``len(counts) + 1`` bin edges in [0, 1] (as :func:`numpy.histogram` returns them) and the share of
    the prompt's positions in each bin that the cache kept.
    """
    return save(draw(df), out, "kept_positions")


@mpl.rc_context(PAPER_RC)
def draw(df: pd.DataFrame) -> Figure:
    """The figure of :func:`kept_positions`, unsaved."""
    df, experiment, cache = settings(df)
    histograms = df["extra"].map(
        lambda extra: extra.get("kept_histogram") if isinstance(extra, dict) else None
    )
    df = df.assign(kept_histogram=histograms).dropna(subset=["kept_histogram"])
    if df.empty:
        raise NothingToDraw('no sample records extra["kept_histogram"] (kept positions are not stored yet)')
    drawn = panels(df, experiment)
    fig, axes = grid(len(drawn))
    for ax, (title, rows) in zip(axes, drawn, strict=True):
        linestyles: dict[str, cycle] = {}  # a method's budgets: one dash pattern each
        for kept in kept_series(rows, cache):
            color = method_color(kept.method)
            linestyle = next(linestyles.setdefault(kept.method, cycle(DASHES)))
            label = kept.label + (f" (mean of {kept.settings} settings)" if kept.settings > 1 else "")
            ax.stairs(kept.mean, kept.edges, color=color, linestyle=linestyle, label=label)
            if kept.settings > 1:
                ax.stairs(kept.high, kept.edges, baseline=kept.low, fill=True, color=color, alpha=CI_ALPHA)
        ax.set(
            title=title, xlabel="Relative prompt position", ylabel="Share kept", xlim=(0, 1), ylim=(0, 1.02)
        )
    legend(fig, axes)
    return fig
