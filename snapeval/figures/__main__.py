"""Paper figures from the results database: ``python -m snapeval.figures [--db URL] [--out DIR]``.

Each figure function takes the samples of :func:`snapeval.results.load` and a folder, writes the figure
there as PDF and PNG, and returns the paths; it raises :class:`NothingToDraw` when the samples hold no
data for it. A panel is one experiment: one setting of everything outside the cache (model, task and its
parameters, generation, seed). Accuracies come with 95% intervals from :func:`snapeval.stats.mean_ci`
(Wilson for 0/1 scores).

Longer than 350 lines: every figure is a short function over one shared loading, panel and styling
code; split it when a figure grows.
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator, ScalarFormatter

from snapeval.errors import SnapevalError
from snapeval.results import ALIASES, DB_ENV_VAR, DEFAULT_DB, config_columns, hashable, load, summarize

DEFAULT_OUT = Path("results/figures")

#: Matplotlib settings of every figure: small serif text for a two-column paper, embeddable fonts.
PAPER_RC: dict[str, object] = {
    "font.family": "serif",
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.4,
    "lines.linewidth": 1.2,
    "lines.markersize": 3.5,
    "errorbar.capsize": 1.5,
    "legend.frameon": False,
    "savefig.dpi": 300,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
}

#: Okabe-Ito colours, distinguishable with colour-blindness: one per method of the registry, in its order.
_PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442")
_FULL_CACHE_COLOR = "#000000"
_LINESTYLES = ("-", "--", ":", "-.")
_CI_ALPHA = 0.18
_PANEL_SIZE = (2.6, 2.1)  # inches per panel
_MAX_COLUMNS = 3
_PARETO_LABEL = "Pareto front"

FigureFunction = Callable[[pd.DataFrame, Path], list[Path]]


class NothingToDraw(SnapevalError):
    """The samples hold no data for a figure; the message says what is missing."""


def method_label(method: str) -> str:
    """The name of a method in figures: its class's ``label`` (:mod:`snapeval.cache.registry`)."""
    from snapeval.cache.registry import method_label as registry_label  # torch loads only to draw

    return registry_label(method)


def method_color(method: str) -> str:
    """A fixed colour per method, the same in every figure: black for the full cache, then the palette in
    the registry's order (a method outside it: one of the colours left, picked from its name)."""
    from snapeval.cache.registry import method_classes

    if method == "full":
        return _FULL_CACHE_COLOR
    compressing = [name for name in method_classes() if name != "full"]
    if method in compressing:
        return _PALETTE[compressing.index(method) % len(_PALETTE)]
    unused = _PALETTE[len(compressing) :] or _PALETTE
    return unused[zlib.crc32(method.encode()) % len(unused)]


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
def accuracy_vs_budget(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Accuracy against KV budget per method, one panel per experiment, over the full cache's accuracy.

    A method swept over more than its budget is drawn at the setting covering the most budgets.
    """
    table, experiment, cache = _results(df)
    if "cache.budget" not in table or table["cache.budget"].isna().all():
        raise NothingToDraw("no compressed run has a budget")
    panels = [
        (title, rows) for title, rows in _panels(table, experiment) if rows["cache.budget"].notna().any()
    ]
    fig, axes = _grid(len(panels))
    for ax, (title, rows) in zip(axes, panels, strict=False):
        _full_cache_line(ax, rows[rows["cache.method"] == "full"])
        compressed = rows[rows["cache.budget"].notna()]
        for method, settings in compressed.groupby("cache.method", sort=True):
            _budget_series(ax, _widest_sweep(settings, cache).sort_values("cache.budget"), method)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(compressed["cache.budget"].unique()))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set(title=title, xlabel="KV budget (slots per head)", ylabel="Accuracy", ylim=(-0.02, 1.02))
    _legend(fig, axes)
    return _save(fig, out, "accuracy_vs_budget")


@mpl.rc_context(PAPER_RC)
def traces_vs_budget(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Mean trace length and truncation rate (answers that hit ``max_new_tokens``) against KV budget per
    method, over the full cache's, a row of two panels per experiment: does compression lengthen
    reasoning?"""
    table, experiment, cache = _results(df)
    has_budget = "cache.budget" in table and table["cache.budget"].notna().any()
    if not has_budget or table["trace_tokens"].isna().all():
        raise NothingToDraw("no compressed run with a budget recorded its traces")
    panels = [
        (title, rows) for title, rows in _panels(table, experiment) if rows["trace_tokens"].notna().any()
    ]
    size = (2 * _PANEL_SIZE[0], _PANEL_SIZE[1] * len(panels) + 0.4)
    fig = Figure(figsize=size, layout="constrained")
    grid = fig.subplots(len(panels), 2, squeeze=False)
    measures = (("trace_tokens", "Generated tokens (mean)"), ("truncated", "Truncated share"))
    for (title, rows), row_axes in zip(panels, grid, strict=True):
        compressed = rows[rows["cache.budget"].notna()]
        row_axes[0].set_title(title, loc="left")
        row_axes[1].set_ylim(-0.02, 1.02)
        for ax, (column, label) in zip(row_axes, measures, strict=True):
            full = rows[rows["cache.method"] == "full"]
            if not full.empty:
                reference = full.loc[full["n"].idxmax(), column]
                ax.axhline(
                    reference, color=method_color("full"), linestyle="--", lw=1, label=method_label("full")
                )
            for method, settings in compressed.groupby("cache.method", sort=True):
                series = _widest_sweep(settings, cache).sort_values("cache.budget")
                ax.plot(
                    series["cache.budget"],
                    series[column],
                    marker="o",
                    color=method_color(method),
                    label=method_label(method),
                )
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(compressed["cache.budget"].unique()))
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set(xlabel="KV budget (slots per head)", ylabel=label)
    _legend(fig, list(grid.ravel()))
    return _save(fig, out, "traces_vs_budget")


@mpl.rc_context(PAPER_RC)
def window_kernel_heatmap(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Accuracy over observation window x pooling kernel, one panel per method, budget and experiment;
    each cell shows the accuracy, its 95% interval and n.

    A panel needs at least two windows and two kernels under otherwise equal settings.
    """
    table, experiment, cache = _results(df)
    if not {"cache.window", "cache.kernel"} <= set(cache):
        raise NothingToDraw("no run has a window and a kernel")
    fixed = [column for column in cache if column not in ("cache.window", "cache.kernel")]
    grids = [
        (title, setting)
        for title, rows in _panels(table, experiment)
        for _, setting in rows.groupby(fixed, dropna=False, sort=True)
        if setting["cache.window"].nunique() >= 2 and setting["cache.kernel"].nunique() >= 2
    ]
    if not grids:
        raise NothingToDraw("no setting was run at two or more windows and two or more kernels")
    settings = pd.DataFrame([setting.iloc[0][fixed] for _, setting in grids])
    headings = [
        ", ".join([_setting_label(row), *differences])
        for (_, row), differences in zip(
            settings.iterrows(), _differences(settings, skip=("cache.method", "cache.budget")), strict=True
        )
    ]
    fig, axes = _grid(len(grids))
    for ax, (title, setting), heading in zip(axes, grids, headings, strict=False):
        cells = {
            values: setting.pivot(index="cache.window", columns="cache.kernel", values=values)
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
        ax.set_xticks(range(accuracy.shape[1]), [_format(kernel) for kernel in accuracy.columns])
        ax.set_yticks(range(accuracy.shape[0]), [_format(window) for window in accuracy.index])
        ax.grid(False)
        ax.set(title=f"{heading}\n{title}", xlabel="Kernel", ylabel="Window")
    fig.colorbar(image, ax=axes, label="Accuracy", shrink=0.8)
    return _save(fig, out, "window_kernel_heatmap")


def _error_bars(accuracy, low, high) -> tuple:
    """(below, above) distances to the interval's ends, never negative (Wilson's ends can round past p)."""
    return np.clip(accuracy - low, 0, None), np.clip(high - accuracy, 0, None)


@mpl.rc_context(PAPER_RC)
def accuracy_vs_memory(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Accuracy against mean KV-cache size (MiB) of every setting, one panel per experiment.

    The Pareto front (no setting is as small and more accurate) is joined by a line and ringed.
    """
    table, experiment, _ = _results(df)
    table = table[table["kv_mib"].notna()]
    if table.empty:
        raise NothingToDraw("no sample has kv_bytes")
    panels = _panels(table, experiment)
    fig, axes = _grid(len(panels))
    for ax, (title, rows) in zip(axes, panels, strict=False):
        for method, points in rows.groupby("cache.method", sort=True):
            error = _error_bars(points["accuracy"], points["ci_low"], points["ci_high"])
            ax.errorbar(
                points["kv_mib"],
                points["accuracy"],
                yerr=error,
                fmt="o",
                color=method_color(method),
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
            label=_PARETO_LABEL,
        )
        ax.set_xlim(left=0)
        ax.set(title=title, xlabel="KV cache (MiB, mean per sample)", ylabel="Accuracy", ylim=(-0.02, 1.02))
    _legend(fig, axes, last=(_PARETO_LABEL,))
    return _save(fig, out, "accuracy_vs_memory")


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
                label=_setting_label(same_size.iloc[0]),
                edges=same_size["kept_histogram"].iloc[0]["bins"],
                mean=per_setting.mean(axis=0),
                low=per_setting.min(axis=0),
                high=per_setting.max(axis=0),
                settings=len(per_setting),
            )
        )
    return series


@mpl.rc_context(PAPER_RC)
def kept_positions(df: pd.DataFrame, out: str | os.PathLike[str]) -> list[Path]:
    """Share of prompt positions kept per relative-position bin: a line per method and budget, and a band
    over the settings run at that budget (windows, kernels, ...) when there are several; a panel per
    experiment.

    Reads ``extra["kept_histogram"]`` of each sample: ``{"bins": [...], "counts": [...]}``, the
    ``len(counts) + 1`` bin edges in [0, 1] (as :func:`numpy.histogram` returns them) and the share of
    the prompt's positions in each bin that the cache kept.
    """
    df, experiment, cache = _settings(df)
    histograms = df["extra"].map(
        lambda extra: extra.get("kept_histogram") if isinstance(extra, dict) else None
    )
    df = df.assign(kept_histogram=histograms).dropna(subset=["kept_histogram"])
    if df.empty:
        raise NothingToDraw('no sample records extra["kept_histogram"] (kept positions are not stored yet)')
    panels = _panels(df, experiment)
    fig, axes = _grid(len(panels))
    for ax, (title, rows) in zip(axes, panels, strict=False):
        linestyles: dict[str, cycle] = {}
        for kept in kept_series(rows, cache):
            color = method_color(kept.method)
            linestyle = next(linestyles.setdefault(kept.method, cycle(_LINESTYLES)))
            label = kept.label + (f" (mean of {kept.settings} settings)" if kept.settings > 1 else "")
            ax.stairs(kept.mean, kept.edges, color=color, linestyle=linestyle, label=label)
            if kept.settings > 1:
                ax.stairs(kept.high, kept.edges, baseline=kept.low, fill=True, color=color, alpha=_CI_ALPHA)
        ax.set(
            title=title, xlabel="Relative prompt position", ylabel="Share kept", xlim=(0, 1), ylim=(0, 1.02)
        )
    _legend(fig, axes)
    return _save(fig, out, "kept_positions")


FIGURES: dict[str, FigureFunction] = {
    "accuracy_vs_budget": accuracy_vs_budget,
    "window_kernel_heatmap": window_kernel_heatmap,
    "accuracy_vs_memory": accuracy_vs_memory,
    "kept_positions": kept_positions,
    "traces_vs_budget": traces_vs_budget,
}


def _settings(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str], list[str]]:
    """``df`` with hashable config values, and its config columns outside and inside the cache."""
    if df.empty:
        raise NothingToDraw("no samples stored")
    config = config_columns(df)
    df = df.assign(**{column: df[column].map(hashable) for column in config})
    cache = [column for column in config if column.startswith("cache.")]
    return df, [column for column in config if column not in cache], cache


def _results(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Accuracy and KV size per setting, with the experiment and cache columns of :func:`_settings`."""
    df, experiment, cache = _settings(df)
    return summarize(df, experiment + cache), experiment, cache


def _panels(table: pd.DataFrame, experiment: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """``(title, rows)`` per experiment: its task, and the settings that set it apart from the others."""
    if not experiment:
        return [("", table)]
    groups = list(table.groupby(experiment, dropna=False, sort=True))
    keys = pd.DataFrame([key for key, _ in groups], columns=experiment)
    tasks = keys["task.name"] if "task.name" in keys else pd.Series("", index=keys.index)
    titles = [
        ", ".join([str(task), *differences])
        for task, differences in zip(tasks, _differences(keys, skip=("task.name",)), strict=True)
    ]
    return [(title, rows) for title, (_, rows) in zip(titles, groups, strict=True)]


def _differences(keys: pd.DataFrame, skip: Collection[str] = ()) -> list[list[str]]:
    """Per row of ``keys``, ``name=value`` for each column (but ``skip``) whose value differs between rows."""
    varying = [
        column for column in keys.columns if column not in skip and keys[column].nunique(dropna=False) > 1
    ]
    return [[f"{_short(column)}={_format(row[column])}" for column in varying] for _, row in keys.iterrows()]


def _short(column: str) -> str:
    aliases = {path: alias for alias, path in ALIASES.items()}
    return aliases.get(column, column.rsplit(".", 1)[-1])


def _format(value: object) -> str:
    """A config value for a title; a key one experiment lacks reads ``-``."""
    if isinstance(value, float):
        return "-" if np.isnan(value) else f"{value:g}"
    return str(value)


def _setting_label(setting: pd.Series) -> str:
    """``SnapKV 256``: the method of a cache setting, and its budget if it has one."""
    budget = setting.get("cache.budget")
    return method_label(setting["cache.method"]) + (f" {_format(budget)}" if pd.notna(budget) else "")


def _widest_sweep(settings: pd.DataFrame, cache: list[str]) -> pd.DataFrame:
    """The rows of the setting (cache parameters besides the budget) that was run at the most budgets."""
    others = [column for column in cache if column not in ("cache.method", "cache.budget", "cache.ratio")]
    if not others:
        return settings
    sweeps = (rows for _, rows in settings.groupby(others, dropna=False, sort=True))
    return max(sweeps, key=lambda rows: (rows["cache.budget"].nunique(), rows["n"].sum()))


def _budget_series(ax: Axes, series: pd.DataFrame, method: str) -> None:
    """Accuracy against budget with its interval: a band over two budgets or more, else an error bar."""
    color, label = method_color(method), method_label(method)
    budget, accuracy, low, high = (series[key] for key in ("cache.budget", "accuracy", "ci_low", "ci_high"))
    if len(series) > 1:
        ax.plot(budget, accuracy, marker="o", color=color, label=label)
        ax.fill_between(budget, low, high, color=color, alpha=_CI_ALPHA, lw=0)
    else:
        ax.errorbar(
            budget, accuracy, yerr=_error_bars(accuracy, low, high), marker="o", color=color, label=label
        )


def _full_cache_line(ax: Axes, full: pd.DataFrame) -> None:
    """The full cache's accuracy across the panel, with its interval as a band."""
    if full.empty:
        return
    reference = full.loc[full["n"].idxmax()]
    color = method_color("full")
    ax.axhline(reference["accuracy"], color=color, linestyle="--", lw=1, label=method_label("full"))
    ax.axhspan(reference["ci_low"], reference["ci_high"], color=color, alpha=_CI_ALPHA / 2, lw=0)


def _grid(panels: int) -> tuple[Figure, list[Axes]]:
    """A figure of ``panels`` axes, at most three a row; unused cells are hidden."""
    columns = min(panels, _MAX_COLUMNS)
    rows = -(-panels // columns)
    fig = Figure(figsize=(_PANEL_SIZE[0] * columns, _PANEL_SIZE[1] * rows + 0.4), layout="constrained")
    axes = list(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def _legend(fig: Figure, axes: list[Axes], last: Collection[str] = ()) -> None:
    """One legend below the panels, with every label of any panel once (those in ``last`` at the end)."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    labels = sorted(entries, key=lambda label: label in last)
    handles = [entries[label] for label in labels]
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 5))


def _save(fig: Figure, out: str | os.PathLike[str], name: str) -> list[Path]:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.{extension}" for extension in ("pdf", "png")]
    for path in paths:
        fig.savefig(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapeval.figures", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db", help=f"database path or SQLAlchemy URL (default: ${DB_ENV_VAR}, else {DEFAULT_DB})"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})"
    )
    args = parser.parse_args(argv)
    try:
        if args.out.exists() and not args.out.is_dir():
            raise SnapevalError(f"{args.out} is a file; give a folder for the figures", "--out")
        df = load(args.db, field="--db")
        for name, draw in FIGURES.items():
            try:
                paths = draw(df, args.out)
            except NothingToDraw as exc:
                print(f"skipped {name}: {exc}")
                continue
            except OSError as exc:
                raise SnapevalError(f"cannot write to {args.out}: {exc.strerror or exc}", "--out") from None
            print(f"wrote {name}: {', '.join(map(str, paths))}")
    except SnapevalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
