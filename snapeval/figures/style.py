"""How figures look: paper rc settings, one colour, marker and dash pattern per method (the report's
charts draw with the same), and labels."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar

import numpy as np
import pandas as pd

from snapeval.configs.cache import FULL
from snapeval.configs.methods import METHODS, method_label
from snapeval.results import ALIASES

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

#: Okabe and Ito's palette ("Color Universal Design", 2008): eight colours told apart with any common
#: colour-vision deficiency.
OKABE_ITO: Mapping[str, str] = MappingProxyType(
    {
        "black": "#000000",
        "orange": "#E69F00",
        "sky blue": "#56B4E9",
        "bluish green": "#009E73",
        "yellow": "#F0E442",
        "blue": "#0072B2",
        "vermillion": "#D55E00",
        "reddish purple": "#CC79A7",
    }
)
#: Each built-in method's colour in every figure and report, one of Okabe-Ito's each: the full cache (the
#: reference) black, the methods most often drawn together (SnapStream, StreamingLLM, SnapKV) the most
#: apart, and the faint yellow for the optional kvpress.
METHOD_COLORS: Mapping[str, str] = MappingProxyType(
    {
        FULL: OKABE_ITO["black"],
        "snapstream": OKABE_ITO["blue"],
        "streaming_llm": OKABE_ITO["vermillion"],
        "snapkv": OKABE_ITO["bluish green"],
        "sage_kv": OKABE_ITO["reddish purple"],
        "rkv": OKABE_ITO["orange"],
        "speculative_prefill": OKABE_ITO["sky blue"],
        "kvpress": OKABE_ITO["yellow"],
    }
)
#: The colours of a method without one in :data:`METHOD_COLORS` (picked from its name): Paul Tol's wine and
#: a grey, apart from every method's.
SPARE_COLORS = ("#882255", "#999999")
#: A marker and a dash pattern per method, in the declarations' order: two methods whose
#: points coincide still show both (a marker inside the other, a line through the other's gaps).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")
DASHES = (
    "-",
    (0, (1, 1)),
    (0, (5, 2)),
    (0, (3, 1, 1, 1)),
    (0, (6, 1.5, 1, 1.5, 1, 1.5)),
    (0, (2, 2)),
    (0, (8, 2)),
    (0, (4, 1, 1, 1, 1, 1)),
    (0, (1, 2)),
)
FULL_CACHE = {"color": METHOD_COLORS[FULL], "marker": "o", "linestyle": "--"}
#: Opacity of a confidence band.
CI_ALPHA = 0.18

T = TypeVar("T")


def method_color(method: str) -> str:
    """``method``'s colour, the same in every figure and report: its :data:`METHOD_COLORS` entry, else
    one of :data:`SPARE_COLORS`, picked from its name."""
    return METHOD_COLORS.get(method) or SPARE_COLORS[zlib.crc32(method.encode()) % len(SPARE_COLORS)]


def method_style(method: str) -> dict[str, object]:
    """``color``, ``marker`` and ``linestyle`` of ``method``, the same in every figure and report; no two
    methods of the declarations share any of the three."""
    if method == FULL:
        return dict(FULL_CACHE)
    return {
        "color": method_color(method),
        "marker": _pick(MARKERS, method),
        "linestyle": _pick(DASHES, method),
    }


def _pick(options: Sequence[T], method: str) -> T:
    """The option at ``method``'s place among the declared compressing methods; a method outside it
    gets one of the options left, picked from its name."""
    compressing = [name for name in METHODS if name != FULL]
    if method in compressing:
        return options[compressing.index(method) % len(options)]
    unused = options[len(compressing) :] or options
    return unused[zlib.crc32(method.encode()) % len(unused)]


def format_value(value: object) -> str:
    """A config value for a title; a key one experiment lacks reads ``-``."""
    if isinstance(value, float):
        return "-" if np.isnan(value) else f"{value:g}"
    return str(value)


def short_name(column: str) -> str:
    """A config column in a title: its alias (:data:`snapeval.results.ALIASES`), else its last part."""
    aliases = {path: alias for alias, path in ALIASES.items()}
    return aliases.get(column, column.rsplit(".", 1)[-1])


def setting_label(setting: pd.Series) -> str:
    """``SnapKV 256``: the method of a cache setting, and its budget if it has one."""
    budget = setting.get("cache.budget")
    return method_label(setting["cache.method"]) + (f" {format_value(budget)}" if pd.notna(budget) else "")
