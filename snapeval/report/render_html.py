"""The report as one self-contained HTML page: CSS inline (with a print stylesheet), figures as base64 SVG
images, kept-prompt histograms as inline SVG; no script, no font, nothing fetched."""

from __future__ import annotations

import base64
from html import escape

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
)

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
  color: #1b1b1b; background: #fff; max-width: 76rem; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
h1 { font-size: 1.55rem; margin: .6rem 0 .8rem; }
h2 { font-size: 1.25rem; margin-top: 2.4rem; padding-bottom: .2rem; border-bottom: 1px solid #bbb; }
h3 { font-size: 1.05rem; margin: 1.5rem 0 .4rem; }
h4 { font-size: .95rem; margin: 1rem 0 .3rem; font-weight: 600; }
p, li { max-width: 60rem; }
nav ol { columns: 2; font-size: .9rem; margin: 0; }
table { border-collapse: collapse; width: 100%; margin: .4rem 0 .8rem; font-size: .84rem; }
th, td { border: 1px solid #d3d3d3; padding: .22rem .4rem; text-align: left; vertical-align: top;
  overflow-wrap: break-word; }
th { background: #f2f2f2; font-weight: 600; }
tbody tr:nth-child(even) { background: #fafafa; }
.pass { color: #0a6430; font-weight: 600; }
.fail { color: #a3161a; }
.muted, .note { color: #5c5c5c; }
.note { font-size: .84rem; }
figure { margin: 1rem 0; }
figure img { width: 100%; max-width: 56rem; height: auto; }
figcaption { font-size: .84rem; color: #5c5c5c; }
svg.kept { vertical-align: middle; }
@page { margin: 12mm; }
@media print {
  body { font-size: 9.5pt; max-width: none; padding: 0; }
  h2 { break-after: avoid; } h3, h4 { break-after: avoid; }
  table { font-size: 8pt; } tr, figure { break-inside: avoid; }
  th, td { padding: .15rem .25rem; }
  thead { display: table-header-group; }
  nav { display: none; }
  a { color: inherit; text-decoration: none; }
}
"""

HISTOGRAM_WIDTH, HISTOGRAM_HEIGHT = 90, 22


def render_html(document: Document) -> str:
    """The page of ``document``."""
    blocks = [_block(block) for block in document.blocks]
    first = next(
        (i for i, b in enumerate(document.blocks) if isinstance(b, Heading) and b.anchor), len(blocks)
    )
    body = "\n".join([*blocks[:first], _contents(document), *blocks[first:]])
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(document.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"{body}\n</body>\n</html>\n"
    )


def _contents(document: Document) -> str:
    """Links to the anchored sections."""
    links = [
        f'<li><a href="#{escape(block.anchor)}">{escape(block.text)}</a></li>'
        for block in document.blocks
        if isinstance(block, Heading) and block.anchor
    ]
    return f'<nav aria-label="Contents"><ol>{"".join(links)}</ol></nav>' if links else ""


def _block(block: Block) -> str:
    if isinstance(block, Heading):
        anchor = f' id="{escape(block.anchor)}"' if block.anchor else ""
        return f"<h{block.level}{anchor}>{escape(block.text)}</h{block.level}>"
    if isinstance(block, Paragraph):
        return f'<p class="note">{escape(block.text)}</p>' if block.note else f"<p>{escape(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{escape(item)}</li>" for item in block.items) + "</ul>"
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Figure):
        return _figure(block)
    raise TypeError(f"not a report block: {block!r}")


def _table(table: Table) -> str:
    head = "".join(f'<th scope="col">{escape(name)}</th>' for name in table.header)
    rows = "".join(
        "<tr>" + "".join(f"<td>{_cell(cell)}</td>" for cell in row) + "</tr>" for row in table.rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _cell(cell: Cell) -> str:
    if isinstance(cell, Mark):
        return f'<span class="{escape(cell.tone)}">{escape(cell.text)}</span>'
    if isinstance(cell, Histogram):
        return histogram_svg(cell)
    return escape(cell)


def _figure(figure: Figure) -> str:
    data = base64.b64encode(figure.svg).decode("ascii")
    return (
        f'<figure><img src="data:image/svg+xml;base64,{data}" alt="{escape(figure.alt)}">'
        f"<figcaption>{escape(figure.caption)}</figcaption></figure>"
    )


def histogram_svg(histogram: Histogram) -> str:
    """A small inline SVG of the share kept per prompt region: a bar per bin, full height for all kept."""
    width, height = HISTOGRAM_WIDTH, HISTOGRAM_HEIGHT
    bars = []
    for left, right, share in zip(histogram.edges, histogram.edges[1:], histogram.counts, strict=False):
        bar = max(0.0, min(1.0, share)) * (height - 2)
        span = max((right - left) * width - 1, 0.5)
        bars.append(
            f'<rect x="{left * width:.1f}" y="{height - 1 - bar:.1f}" width="{span:.1f}" height="{bar:.1f}" '
            'fill="#0072B2"/>'
        )
    shares = " ".join(f"{share:.2f}" for share in histogram.counts)
    return (
        f'<svg class="kept" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        f"<title>share of the prompt kept, first to last region: {shares}</title>"
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f0f0f0"/>{"".join(bars)}'
        f'<line x1="0" y1="{height - 1}" x2="{width}" y2="{height - 1}" stroke="#888"/></svg>'
    )
