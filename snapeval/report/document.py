"""The report as a sequence of blocks (headings, paragraphs, lists, tables, figures) that both renderers
draw, and how numbers read in it."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    anchor: str = ""


@dataclass(frozen=True)
class Paragraph:
    """Prose; ``note`` for the small print under a table."""

    text: str
    note: bool = False


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Mark:
    """A table cell's text with a tone: ``pass``, ``fail`` or ``muted``."""

    text: str
    tone: str


@dataclass(frozen=True)
class Histogram:
    """A kept-prompt histogram in a cell: ``counts[i]``, the share kept of ``[edges[i], edges[i+1])``."""

    edges: tuple[float, ...]
    counts: tuple[float, ...]


Cell = str | Mark | Histogram


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]


@dataclass(frozen=True)
class Figure:
    """An SVG image (``svg``: its bytes), with its text alternative and caption."""

    svg: bytes
    alt: str
    caption: str


Block = Heading | Paragraph | Bullets | Table | Figure


@dataclass(frozen=True)
class Document:
    title: str
    blocks: tuple[Block, ...]


def number(value: float | None, digits: int = 3) -> str:
    """``value`` to ``digits`` decimals; ``-`` for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def interval(mean: float, low: float, high: float, digits: int = 3) -> str:
    """``0.850 [0.640, 0.948]``; the mean alone where the interval is unknown."""
    if math.isnan(low) or math.isnan(high):
        return number(mean, digits)
    return f"{number(mean, digits)} [{number(low, digits)}, {number(high, digits)}]"


def signed(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:+.3f}"


def binary_size(size: float) -> str:
    """Bytes in binary units: ``4.00 GiB``, ``720 MiB``."""
    if math.isnan(size):
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale
            return f"{value:.2f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    return f"{size:,.0f} B"


def shortened(text: object, limit: int = 80) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def sparkline(histogram: Histogram) -> str:
    """The histogram as block characters, for text: one per bin, its height the share kept."""
    blocks = "·▁▂▃▄▅▆▇█"
    return "".join(blocks[round(min(max(count, 0.0), 1.0) * (len(blocks) - 1))] for count in histogram.counts)
