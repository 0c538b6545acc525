"""What the figures over the KV budget share: one series per method (its widest budget sweep), drawn a
little apart in log space so that coinciding series stay visible, the budget axis, and the full cache's
reference line."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import NullLocator, ScalarFormatter

from snapeval.configs.cache import FULL
from snapeval.figures.panels import error_bars
from snapeval.figures.style import CI_ALPHA, method_label, method_style

BUDGET_LABEL = "KV budget (slots per head)"
#: The step between two methods' points at one budget, as a share of the panel's budgets' span in log2
#: (at most the closest budgets' gap over twice the methods, so neighbouring budgets never interleave).
DODGE = 0.035


def method_sweeps(compressed: pd.DataFrame, cache: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """``(method, rows by budget)`` per method of ``compressed`` (settings that have a budget), with a
    ``budget_x`` column: where to draw each budget, a small step from the other methods' points."""
    sweeps = [
        (method, widest_sweep(rows, cache).sort_values("cache.budget"))
        for method, rows in compressed.groupby("cache.method", sort=True)
    ]
    factors = dodge([method for method, _ in sweeps], compressed["cache.budget"])
    return [
        (method, rows.assign(budget_x=rows["cache.budget"] * factor))
        for (method, rows), factor in zip(sweeps, factors, strict=True)
    ]


def dodge(methods: list[str], budgets: Iterable[float]) -> list[float]:
    """Per method, the factor its budgets are drawn at: one step apart in log space, centred on 1."""
    logs = np.log2(sorted(set(budgets)))
    span = max(logs[-1] - logs[0], 1.0)
    closest = np.diff(logs).min() if len(logs) > 1 else span
    step = min(DODGE * span, closest / (2 * len(methods)))
    middle = (len(methods) - 1) / 2
    return [float(2 ** ((index - middle) * step)) for index in range(len(methods))]


def widest_sweep(settings: pd.DataFrame, cache: list[str]) -> pd.DataFrame:
    """The rows of the setting (cache parameters besides the budget) that was run at the most budgets."""
    others = [column for column in cache if column not in ("cache.method", "cache.budget", "cache.ratio")]
    if not others:
        return settings
    sweeps = (rows for _, rows in settings.groupby(others, dropna=False, sort=True))
    return max(sweeps, key=lambda rows: (rows["cache.budget"].nunique(), rows["n"].sum()))


def budget_axis(ax: Axes, budgets: Iterable[float]) -> None:
    """A log2 x axis with a tick at each budget run, written out (``256``, not ``2^8``)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(budgets)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(BUDGET_LABEL)


def full_cache_line(ax: Axes, full: pd.DataFrame, column: str, band: bool = False) -> None:
    """The full cache's ``column`` across the panel (its largest run), with its 95% interval as a band
    if ``band``."""
    if full.empty:
        return
    reference = full.loc[full["n"].idxmax()]
    style = method_style(FULL)
    ax.axhline(
        reference[column],
        color=style["color"],
        linestyle=style["linestyle"],
        lw=1,
        label=method_label(FULL),
    )
    if band:
        ax.axhspan(reference["ci_low"], reference["ci_high"], color=style["color"], alpha=CI_ALPHA / 2, lw=0)


def accuracy_panel(ax: Axes, rows: pd.DataFrame, cache: list[str]) -> None:
    """Accuracy against budget of ``rows`` (one panel's settings): the full cache's dashed line and band,
    and each method's series with its 95% interval; the budget axis and the accuracy axis."""
    full_cache_line(ax, rows[rows["cache.method"] == FULL], "accuracy", band=True)
    compressed = rows[rows["cache.budget"].notna()]
    for method, sweep in method_sweeps(compressed, cache):
        _accuracy_series(ax, sweep, method)
    budget_axis(ax, compressed["cache.budget"])
    ax.set(ylabel="Accuracy", ylim=(-0.02, 1.02))


def _accuracy_series(ax: Axes, sweep: pd.DataFrame, method: str) -> None:
    """Accuracy against budget with its interval: a band over two budgets or more, else an error bar."""
    style, label = method_style(method), method_label(method)
    budget, accuracy, low, high = (sweep[key] for key in ("budget_x", "accuracy", "ci_low", "ci_high"))
    if len(sweep) > 1:
        ax.plot(budget, accuracy, label=label, **style)
        ax.fill_between(budget, low, high, color=style["color"], alpha=CI_ALPHA, lw=0)
    else:
        ax.errorbar(budget, accuracy, yerr=error_bars(accuracy, low, high), label=label, **style)
