"""Summaries of loaded results: accuracy with its confidence interval, pass@k, KV size and speed per
experiment, and the config columns that tell experiments apart."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from snapeval.results.identity import ALIASES, UNHASHED
from snapeval.results.schema import samples
from snapeval.stats import mean_ci, pass_at


def config_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``df`` (from :func:`load`) that hold the stored config, less what
    :data:`~snapeval.results.identity.UNHASHED` leaves out of the config hash: together, they tell
    experiments apart."""
    not_config = {*samples.c.keys(), *ALIASES, "git_sha", "status", "created_at"}

    def ignored(column: str) -> bool:
        return any(column == key or column.startswith(f"{key}.") for key in UNHASHED)

    return [c for c in df.columns if c not in not_config and not c.startswith("metric.") and not ignored(c)]


def experiment_keys(df: pd.DataFrame) -> list[str]:
    """The :data:`ALIASES` columns ``df`` has, then every other config column whose value differs
    between configs that share those: grouping by them never pools two experiments."""
    aliases = [alias for alias in ALIASES if alias in df.columns]
    aliased = {ALIASES[alias] for alias in aliases}
    others = [column for column in config_columns(df) if column not in aliased]
    values = df[others].map(hashable)
    by_aliases = values.groupby([df[a].map(hashable) for a in aliases], dropna=False) if aliases else None
    if by_aliases is None:
        return [column for column in others if values[column].nunique(dropna=False) > 1]
    varying = by_aliases.nunique(dropna=False).max() if len(values) else pd.Series(dtype=int)
    return aliases + [column for column in others if varying.get(column, 1) > 1]


def hashable(value: object) -> object:
    """A config value that pandas can group by: lists and dicts as sorted JSON."""
    return json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else value


def summarize(df: pd.DataFrame, keys: Sequence[str] | None = None) -> pd.DataFrame:
    """:func:`summary_of` per group of ``keys`` (by default :func:`experiment_keys`: one row per
    experiment, the config columns that set it apart shown)."""
    keys = list(keys) if keys is not None else experiment_keys(df)
    df = df.assign(**{key: df[key].map(hashable) for key in keys})
    groups = df.groupby(keys, dropna=False, sort=True) if keys else [((), df)]
    rows = [
        {**dict(zip(keys, key, strict=True)), **summary_of(group.to_dict("records"))} for key, group in groups
    ]
    return pd.DataFrame(rows)


def summary_of(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The one summary of stored samples that every table shows (the run's, the sweep's, the CLI's):
    accuracy with its 95% interval (:func:`snapeval.stats.mean_ci`), n, mean KV MiB (``kv_bytes``: the
    whole row's, over every rank, so samples stored at different TP degrees average alike) and prefill
    seconds, decode tokens/s (generated tokens over decode time), the traces' length and truncation
    (:func:`trace_summary`), and pass@k where the draws allow (:func:`snapeval.stats.pass_at`)."""
    scored = [s for s in samples if _present(s.get("score"))]
    accuracy, ci_low, ci_high = mean_ci(s["score"] for s in scored)
    decode_s = sum(s["decode_s"] for s in samples if _present(s.get("decode_s")))
    generated = sum(s["generated_tokens"] for s in samples if _present(s.get("generated_tokens")))
    return {
        "accuracy": accuracy,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "n": len(scored),
        "kv_mib": _mean(s.get("kv_bytes") for s in samples) / 2**20,
        "prefill_s": _mean(s.get("prefill_s") for s in samples),
        "decode_tok_s": generated / decode_s if decode_s > 0 else float("nan"),
        **trace_summary(s.get("extra") for s in samples),
        **pass_at([str(s.get("sample_id")) for s in scored], [s["score"] for s in scored]),
    }


def _present(value: Any) -> bool:
    return value is not None and value == value  # NaN != NaN


def _mean(values: Iterable[Any]) -> float:
    kept = [value for value in values if _present(value)]
    return sum(kept) / len(kept) if kept else float("nan")


def trace_summary(extras: Iterable[Any]) -> dict[str, float]:
    """From the samples' traces (``extra.trace``, stored by the runner): mean generated tokens, the share
    that hit ``max_new_tokens``, mean re-selections while decoding (``evictions``) and mean share of the
    generated tokens held at the end (``kept_generated``); NaN where no sample has one."""
    traces = [extra["trace"] for extra in extras if isinstance(extra, dict) and extra.get("trace")]
    return {
        "trace_tokens": _mean(t["generated_tokens"] for t in traces),
        "truncated": _mean(bool(t["truncated"]) for t in traces),
        "evictions": _mean(t.get("eviction_count") for t in traces),
        "kept_generated": _mean(t.get("kept_generated_share") for t in traces),
    }


#: The keys of every :func:`summary_of`, in its order (``pass@<k>`` follow where the draws allow): the
#: summary's numbers, by the names every table and :class:`snapeval.run.runner.RunSummary` use.
SUMMARY_KEYS: tuple[str, ...] = tuple(summary_of([]))
#: The keys of :func:`trace_summary`, the last of :data:`SUMMARY_KEYS`.
TRACE_KEYS: tuple[str, ...] = tuple(trace_summary([]))
