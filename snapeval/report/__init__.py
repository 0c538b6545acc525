"""The decision report of a results database: ``python -m snapeval.report --db URL --out report.html``.

One self-contained HTML page (or Markdown with ``--markdown``) that tells an inference team whether to
ship a compressed KV cache: per model and task, each method's accuracy and paired retention against the
full cache over the budgets measured, the smallest budget meeting each retention target (the gate's
rule; with ``--max-output-growth``, also shown to keep output growth within the bound), KV bytes and rows
per accelerator from the memory estimator, speed, output length against the full cache's and what it
costs, the accuracy of each turn where samples asked several questions of one context, the samples that
flipped, trace statistics and provenance; the verdicts of accuracy gates when given. It reads the
database and the estimator's shipped catalogue only: no model, no torch.

Modules: :mod:`~snapeval.report.data` (settings grouped into experiments),
:mod:`~snapeval.report.analysis` (retention, bounds, decisions, flips), :mod:`~snapeval.report.capacity`
(the estimator), :mod:`~snapeval.report.provenance`, :mod:`~snapeval.report.charts` (figures),
:mod:`~snapeval.report.experiment` and :mod:`~snapeval.report.build` (the blocks),
:mod:`~snapeval.report.output_length` (output length and its cost per setting),
:mod:`~snapeval.report.engines` (each deployed engine against snapeval's reference),
:mod:`~snapeval.report.turns` (the accuracy of each turn of multi-turn samples),
:mod:`~snapeval.report.document` (the blocks' types) and the two renderers,
:mod:`~snapeval.report.render_html` and :mod:`~snapeval.report.render_markdown`.
"""

from snapeval.report.build import build_report
from snapeval.report.render_html import render_html
from snapeval.report.render_markdown import render_markdown

__all__ = ["build_report", "render_html", "render_markdown"]
