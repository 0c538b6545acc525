"""Paper figures from the results database: ``python -m snapeval.figures [--db URL] [--out DIR]``.

Each figure function takes the samples of :func:`snapeval.results.load` and a folder, writes the figure
there as PDF and PNG, and returns the paths; it raises :class:`NothingToDraw` when the samples hold no
data for it. A panel is one experiment (:mod:`snapeval.figures.panels`). Accuracies come with 95%
intervals from :func:`snapeval.stats.mean_ci` (Wilson for 0/1 scores). Colours, markers and dashes
(:mod:`snapeval.figures.style`) are fixed per method across figures.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from snapeval.figures.budget import accuracy_vs_budget
from snapeval.figures.evictions import decode_evictions
from snapeval.figures.heatmap import window_kernel_heatmap
from snapeval.figures.kept import KeptSeries, kept_positions, kept_series
from snapeval.figures.memory import accuracy_vs_memory, pareto_front
from snapeval.figures.panels import NothingToDraw
from snapeval.figures.style import PAPER_RC, method_color, method_label, method_style
from snapeval.figures.traces import traces_vs_budget
from snapeval.figures.turns import accuracy_per_turn

FigureFunction = Callable[[pd.DataFrame, str | os.PathLike[str]], list[Path]]

#: Every figure by name, in the order the command writes them.
FIGURES: dict[str, FigureFunction] = {
    "accuracy_vs_budget": accuracy_vs_budget,
    "window_kernel_heatmap": window_kernel_heatmap,
    "accuracy_vs_memory": accuracy_vs_memory,
    "kept_positions": kept_positions,
    "traces_vs_budget": traces_vs_budget,
    "decode_evictions": decode_evictions,
    "accuracy_per_turn": accuracy_per_turn,
}

__all__ = [
    "FIGURES",
    "PAPER_RC",
    "FigureFunction",
    "KeptSeries",
    "NothingToDraw",
    "accuracy_per_turn",
    "accuracy_vs_budget",
    "accuracy_vs_memory",
    "decode_evictions",
    "kept_positions",
    "kept_series",
    "method_color",
    "method_label",
    "method_style",
    "pareto_front",
    "traces_vs_budget",
    "window_kernel_heatmap",
]
