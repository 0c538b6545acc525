"""The report as Markdown: the same headings, prose and tables as the HTML page; kept-prompt histograms
as block-character sparklines, and no figures (the HTML page draws them)."""

from __future__ import annotations

from snapeval.report.document import (
    Block,
    Bullets,
    Cell,
    Document,
    Figure,
    Heading,
    Histogram,
    Mark,
    Paragraph,
    Table,
    sparkline,
)


def render_markdown(document: Document) -> str:
    """The Markdown text of ``document``."""
    return "\n\n".join(text for text in map(_block, document.blocks) if text) + "\n"


def _block(block: Block) -> str:
    if isinstance(block, Heading):
        return f"{'#' * block.level} {block.text}"
    if isinstance(block, Paragraph):
        return f"*{_escape(block.text)}*" if block.note else _escape(block.text)
    if isinstance(block, Bullets):
        return "\n".join(f"- {_escape(item)}" for item in block.items)
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Figure):
        return ""
    raise TypeError(f"not a report block: {block!r}")


def _table(table: Table) -> str:
    lines = [_row(tuple(map(_escape, table.header))), "|" + "---|" * len(table.header)]
    lines += [_row(tuple(map(_cell, row))) for row in table.rows]
    return "\n".join(lines)


def _row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _cell(cell: Cell) -> str:
    if isinstance(cell, Mark):
        return f"**{_escape(cell.text)}**" if cell.tone == "pass" else _escape(cell.text)
    if isinstance(cell, Histogram):
        return sparkline(cell)
    return _escape(cell)


def _escape(text: str) -> str:
    """``text`` on one line, what Markdown would read as markup (code, emphasis, HTML tags, entities)
    escaped: stored answers show as they are."""
    flat = " ".join(text.split())
    for char in "\\`*":
        flat = flat.replace(char, "\\" + char)
    return flat.replace("&", "&amp;").replace("<", "&lt;")
