"""The figure ``decode_evictions``: what compressing while decoding costs and where it happens, for
reasoning traces (R-KV, kvpress's decoding presses, SnapStream with re-selection)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from snapeval.configs.cache import FULL
from snapeval.figures.panels import NothingToDraw, error_bars, grid, legend, panels, save, settings
from snapeval.figures.style import (
    DASHES,
    PAPER_RC,
    format_value,
    method_label,
    method_style,
    setting_label,
    short_name,
)
from snapeval.results import summary_of

#: The three panels of an experiment, left to right.
TITLES = ("Accuracy at equal memory", "What a row holds at the end", "Where rows were re-selected")
TRACE_END = "Mean trace length"
SIZES = ("cache.method", "cache.budget", "cache.ratio")  # what a series runs over, and its method


@dataclass(frozen=True)
class Setting:
    """One cache setting of an experiment: its summary, its traces' means and every re-selection step."""

    row: pd.Series  # the setting's config columns
    summary: dict[str, float]  # :func:`snapeval.results.summary_of` of its samples
    kept_prompt: float  # mean share of the prompt held at the end (NaN: the full cache)
    kept_generated: float  # mean share of the generated tokens held at the end (NaN: the full cache)
    steps: list[list[int]]  # per sample, the decode steps at which the row was re-selected

    @property
    def evictions(self) -> float:
        """Re-selections per sample."""
        return float(np.mean([len(steps) for steps in self.steps]))


def decode_evictions(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """A row of three panels per experiment whose rows were re-selected while decoding: accuracy against
    mean KV MiB per row (methods hold different rows at one budget: R-KV ``budget + buffer``, kvpress's
    decoding presses ``budget + compression_interval``, SnapStream ``budget``), a line per method over its
    budgets, the full cache a point; the share of the prompt and of the generated tokens a row still
    holds at the end; and, per setting, the decode steps at which rows were re-selected, with the mean
    trace length.

    Reads ``extra["trace"]`` of each sample: ``evictions`` (decode steps), ``kept_prompt_share`` and
    ``kept_generated_share``.
    """
    return save(draw(df), out, "decode_evictions")


@mpl.rc_context(PAPER_RC)
def draw(df: pd.DataFrame) -> Figure:
    """The figure of :func:`decode_evictions`, unsaved."""
    df, experiment, cache = settings(df)
    traces = df["extra"].map(lambda extra: extra.get("trace") if isinstance(extra, dict) else None)
    df = df.assign(trace=traces)
    evicted = df["trace"].map(lambda trace: bool(isinstance(trace, dict) and trace.get("evictions")))
    if not evicted.any():
        raise NothingToDraw('no sample records a re-selection while decoding (extra["trace"]["evictions"])')
    drawn = [(title, rows) for title, rows in panels(df, experiment) if evicted[rows.index].any()]
    fig, axes = grid(len(TITLES) * len(drawn), columns=len(TITLES))
    for index, (title, rows) in enumerate(drawn):
        series = method_series(setting_summaries(rows, cache), cache)
        accuracy_ax, kept_ax, steps_ax = axes[index * len(TITLES) : (index + 1) * len(TITLES)]
        for one in series:
            _accuracy(accuracy_ax, one)
            _kept(kept_ax, one)
        _steps(steps_ax, series)
        accuracy_ax.set(xlabel="KV cache per row (MiB, mean)", ylabel="Accuracy", ylim=(-0.02, 1.02))
        accuracy_ax.set_xlim(left=0)
        kept_ax.set(
            xlabel="Prompt kept (share)", ylabel="Generated kept (share)", xlim=(0, 1.05), ylim=(0, 1.05)
        )
        steps_ax.set_xlabel("Decode step")
        for ax, heading in zip((accuracy_ax, kept_ax, steps_ax), TITLES, strict=True):
            ax.set_title(f"{title}\n{heading}" if title else heading)
    legend(fig, axes, last=(TRACE_END,))
    return fig


def setting_summaries(rows: pd.DataFrame, cache: list[str]) -> list[Setting]:
    """One :class:`Setting` per cache setting of ``rows`` (samples with their ``trace``)."""
    found = []
    for _, samples in rows.groupby(cache, dropna=False, sort=True):
        traces = [trace for trace in samples["trace"] if isinstance(trace, dict)]
        found.append(
            Setting(
                row=samples.iloc[0][cache],
                summary=summary_of(samples.to_dict("records")),
                kept_prompt=_mean(trace.get("kept_prompt_share") for trace in traces),
                kept_generated=_mean(trace.get("kept_generated_share") for trace in traces),
                steps=[list(trace.get("evictions") or ()) for trace in traces],
            )
        )
    return found


@dataclass(frozen=True)
class Series:
    """The settings of one method that differ only in budget, by budget, and how they are drawn."""

    method: str
    apart: list[str]  # ``name=value`` of the parameters that set it apart from the method's other series
    style: dict[str, object]
    members: list[Setting]

    @property
    def label(self) -> str:
        return ", ".join([method_label(self.method), *self.apart])

    def member_label(self, setting: Setting) -> str:
        """``SnapStream 128, reselect_every=16``: the method, the setting's budget, then :attr:`apart`."""
        return ", ".join([setting_label(setting.row), *self.apart])


def method_series(found: list[Setting], cache: list[str]) -> list[Series]:
    """The settings as series over budgets, one per method and setting of its other parameters; a
    method's second series on is told apart by its label and its dash pattern."""
    others = [column for column in cache if column not in SIZES]
    groups: dict[tuple, list[Setting]] = {}
    for setting in found:
        key = (setting.row["cache.method"], *(format_value(setting.row.get(column)) for column in others))
        groups.setdefault(key, []).append(setting)
    series = []
    for method in dict.fromkeys(key[0] for key in groups):
        keys = sorted((key for key in groups if key[0] == method), key=lambda key: [v != "-" for v in key])
        varying = [i for i in range(len(others)) if len({key[i + 1] for key in keys}) > 1]
        style = method_style(method)
        for number, key in enumerate(keys):
            apart = [f"{short_name(others[i])}={key[i + 1]}" for i in varying if key[i + 1] != "-"]
            drawn = style if number == 0 else {**style, "linestyle": _dash(style, number)}
            series.append(Series(method, apart, drawn, sorted(groups[key], key=_by_budget)))
    return series


def _accuracy(ax: Axes, series: Series) -> None:
    """Accuracy (95% interval) against mean KV MiB per row, over the series' budgets."""
    summaries = pd.DataFrame([setting.summary for setting in series.members])
    accuracy, low, high = summaries["accuracy"], summaries["ci_low"], summaries["ci_high"]
    yerr = error_bars(accuracy, low, high)
    front = {"zorder": 3} if series.method == FULL else {}  # the reference, over a method at its size
    ax.errorbar(summaries["kv_mib"], accuracy, yerr=yerr, label=series.label, **series.style, **front)


def _kept(ax: Axes, series: Series) -> None:
    """Share of the prompt against share of the generated tokens held at the end, each budget written."""
    points = [s for s in series.members if not np.isnan(s.kept_prompt) and not np.isnan(s.kept_generated)]
    if not points:
        return
    x, y = [s.kept_prompt for s in points], [s.kept_generated for s in points]
    ax.plot(x, y, label=series.label, **series.style)
    for setting, at in zip(points, zip(x, y, strict=True), strict=True):
        if not np.isnan(budget := _budget(setting)):
            ax.annotate(format_value(budget), at, xytext=(3, 2), textcoords="offset points", fontsize=5)


def _steps(ax: Axes, series: list[Series]) -> None:
    """A row per setting that re-selected, its label above it (with the re-selections per sample): the
    decode steps at which any of its rows was re-selected, and a mark at its mean trace length."""
    rows = [(one, setting) for one in series for setting in one.members if setting.evictions > 0]
    for offset, (one, setting) in enumerate(rows):
        steps = sorted({step for sample in setting.steps for step in sample})
        ax.eventplot([steps], lineoffsets=offset, linelengths=0.5, linewidths=0.6, colors=one.style["color"])
        ax.plot(setting.summary["trace_tokens"], offset, "|", color="0.2", ms=6, mew=1.2, label=TRACE_END)
        label = f"{one.member_label(setting)}: {setting.evictions:.1f} per sample"
        ax.text(0.01, offset - 0.3, label, transform=ax.get_yaxis_transform(), fontsize=5, va="bottom")
    ax.set_yticks([])
    ax.set_ylim(len(rows) - 0.5, -0.9)  # the first setting on top, room for its label
    ax.set_xlim(left=0)


def _dash(style: dict[str, object], number: int) -> object:
    """The dash pattern ``number`` steps after ``style``'s (a method's series after its first)."""
    start = DASHES.index(style["linestyle"]) if style["linestyle"] in DASHES else 0
    return DASHES[(start + number) % len(DASHES)]


def _budget(setting: Setting) -> float:
    budget = setting.row.get("cache.budget")
    return float(budget) if pd.notna(budget) else float("nan")


def _by_budget(setting: Setting) -> tuple[bool, float]:
    budget = _budget(setting)
    return (bool(np.isnan(budget)), 0.0 if np.isnan(budget) else budget)


def _mean(values: Iterable[Any]) -> float:
    kept = [float(value) for value in values if value is not None]
    return float(np.mean(kept)) if kept else float("nan")
