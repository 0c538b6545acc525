"""The one table formatter of snapeval's commands: the run table (``python -m snapeval``), the sweep's
closing table (:mod:`snapeval.run.sweep`) and the results summary (``python -m snapeval.results summary``)
show a setting's numbers (:func:`snapeval.results.summary_of`) under the same names, in the same formats.

Each table picks its columns from :data:`NUMBERS` (plus ``95% CI`` and the ``pass@k`` that the draws
allow); a number that is missing or NaN shows as ``-``; columns of numbers are right-aligned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from snapeval.results.summary import SUMMARY_KEYS, TRACE_KEYS

if TYPE_CHECKING:
    import pandas as pd


MISSING = "-"
CI = "95% CI"  # the confidence interval of the accuracy, from ``ci_low`` and ``ci_high``
PASS_AT = "pass@k"  # every ``pass@<k>`` a summary holds
PASS_AT_FORMAT = "{:.3f}"

#: Each number of a summary: its column name and its format.
NUMBERS: dict[str, tuple[str, str]] = {
    "accuracy": ("accuracy", "{:.3f}"),
    "n": ("n", "{:.0f}"),
    "computed": ("new", "{:.0f}"),
    "kv_mib": ("KV MiB", "{:.1f}"),
    "prefill_s": ("prefill s", "{:.2f}"),
    "decode_tok_s": ("decode tok/s", "{:.1f}"),
    "s_per_sample": ("s/sample", "{:.2f}"),
    "trace_tokens": ("trace tok", "{:.0f}"),
    "truncated": ("truncated", "{:.0%}"),
    "evictions": ("evictions", "{:.1f}"),
    "kept_generated": ("gen kept", "{:.0%}"),
}
#: The numbers of each table, in the one order every table keeps.
RUN_COLUMNS = ("accuracy", CI, PASS_AT, "n", "computed", "kv_mib", "prefill_s", "decode_tok_s")
SWEEP_COLUMNS = ("accuracy", CI, "n", "kv_mib", "s_per_sample", "trace_tokens", "truncated")
SUMMARY_COLUMNS = ("accuracy", CI, PASS_AT, "n", "kv_mib", "prefill_s", "decode_tok_s", *TRACE_KEYS)
#: The trace columns as they are shown: the summary drops each that no experiment has.
TRACE_COLUMNS = tuple(NUMBERS[key][0] for key in TRACE_KEYS)


def missing(value: Any) -> bool:
    """None or NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def number(value: Any, form: str) -> str:
    """``value`` in ``form`` (a format string), or ``-`` when it is missing."""
    return MISSING if missing(value) else form.format(value)


def interval(low: Any, high: Any) -> str:
    """A 95% confidence interval as ``[0.301, 0.954]``."""
    return MISSING if missing(low) or missing(high) else f"[{low:.3f}, {high:.3f}]"


def numbers(summary: Mapping[str, Any], columns: Sequence[str]) -> dict[str, str]:
    """The ``columns`` (keys of :data:`NUMBERS`, :data:`CI`, :data:`PASS_AT`) of one summary, by name."""
    cells: dict[str, str] = {}
    for column in columns:
        if column == CI:
            cells[CI] = interval(summary.get("ci_low"), summary.get("ci_high"))
        elif column == PASS_AT:
            at_k = {key: value for key, value in summary.items() if key.startswith("pass@")}
            cells |= {key: number(value, PASS_AT_FORMAT) for key, value in at_k.items()}
        else:
            name, form = NUMBERS[column]
            cells[name] = number(summary.get(column), form)
    return cells


def cache_label(cache: Mapping[str, Any]) -> str:
    """A cache setting as ``snapkv(budget=256, window=32)``: the method, then its set parameters."""
    setting = ", ".join(f"{k}={v}" for k, v in cache.items() if k != "method" and v is not None)
    return f"{cache['method']}({setting})" if setting else str(cache["method"])


def task_label(config: Mapping[str, Any]) -> str:
    """The task's name, and the protocol preset it ran under (``+protocol=...``), if any."""
    protocol = config.get("protocol")
    return f"{config['task']['name']} ({protocol['name']})" if protocol else config["task"]["name"]


def render(rows: Sequence[Mapping[str, Any]] | pd.DataFrame) -> str:
    """``rows`` (a mapping per row, or a DataFrame) as a GitHub-style table with the columns of every row:
    a missing value as ``-``, a float that is a whole number as one (a budget of 256, not 256.0),
    columns of numbers right-aligned."""
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
    if not records:
        return ""
    headers = list(dict.fromkeys(key for record in records for key in record))  # every row's, in order
    table = [[_cell(record.get(header)) for header in headers] for record in records]
    align = ["right" if all(map(_numeric, column)) else "left" for column in zip(*table, strict=True)]
    return tabulate(table, headers=headers, tablefmt="github", disable_numparse=True, colalign=align)


def run_table(summaries: Sequence[Any]) -> str:
    """The run's table (of the runner's ``RunSummary`` s), a row per cache setting: what ran, accuracy with
    its 95% CI, pass@k and n, how many samples were new, KV memory and speed; and a note when other workers
    hold some samples."""
    at_k = dict.fromkeys(key for summary in summaries for key in summary.pass_at)  # a grid's draws may differ
    rows = [
        {
            "model": summary.config["model"]["name"],
            "task": task_label(summary.config),
            "cache": cache_label(summary.config["cache"]),
            **numbers({**vars(summary), **{key: summary.pass_at.get(key) for key in at_k}}, RUN_COLUMNS),
        }
        for summary in summaries
    ]
    table = render(rows)
    if elsewhere := sum(summary.elsewhere for summary in summaries):
        table += (
            f"\n{elsewhere} sample(s) were claimed by other workers on the same point(s): see their output"
            ", or python -m snapeval.results summary once they finish"
        )
    return table


def summary_table(summaries: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of the results summary (from :func:`snapeval.results.summarize`): the settings that tell
    experiments apart, then their numbers; each trace column only where some experiment has it."""
    rows = []
    for record in summaries.to_dict("records"):
        settings = {k: v for k, v in record.items() if k not in SUMMARY_KEYS and not k.startswith("pass@")}
        rows.append({**settings, **numbers(record, SUMMARY_COLUMNS)})
    for column in TRACE_COLUMNS:
        if all(row[column] == MISSING for row in rows):
            for row in rows:
                del row[column]
    return rows


def _cell(value: Any) -> str:
    if missing(value):
        return MISSING
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _numeric(text: str) -> bool:
    """A number as the table shows it (``0.750``, ``50%``, ``12``), or ``-``."""
    try:
        float(text.removesuffix("%"))
    except ValueError:
        return text == MISSING
    return True
