"""Summaries of loaded results: accuracy with its confidence interval, pass@k, KV size and speed per
experiment, and the config columns that tell experiments apart."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from snapeval.results.identity import ALIASES, DEFAULT_IGNORED
from snapeval.results.schema import samples
from snapeval.stats import mean_ci, pass_at


def config_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``df`` (from :func:`load`) that hold the stored config, less what
    :data:`DEFAULT_IGNORED` leaves out of the config hash: together, they tell experiments apart."""
    not_config = {*samples.c.keys(), *ALIASES, "git_sha", "status", "created_at"}

    def ignored(column: str) -> bool:
        return any(column == key or column.startswith(f"{key}.") for key in DEFAULT_IGNORED)

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
    """Accuracy with its confidence interval, KV size and speed per group of ``keys`` (by default
    :func:`experiment_keys`: one row per experiment, the config columns that set it apart shown).

    ``decode_tok_s`` is the total of generated tokens over the total decode time; ``trace_tokens`` and
    ``truncated`` describe the (first-call) traces, see :func:`trace_summary`.
    """
    keys = list(keys) if keys is not None else experiment_keys(df)
    df = df.assign(**{key: df[key].map(hashable) for key in keys})
    groups = df.groupby(keys, dropna=False, sort=True) if keys else [((), df)]
    rows = []
    for key, group in groups:
        accuracy, ci_low, ci_high = mean_ci(group["score"].dropna())
        decode_s = group["decode_s"].sum()
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                "accuracy": accuracy,
                "ci_low": ci_low,
                "ci_high": ci_high,
                "n": int(group["score"].notna().sum()),
                "kv_mib": group["kv_bytes"].mean() / 2**20,
                "prefill_s": group["prefill_s"].mean(),
                "decode_tok_s": group["generated_tokens"].sum() / decode_s if decode_s > 0 else float("nan"),
                **trace_summary(group.get("extra", [])),
                **(pass_at(group["sample_id"], group["score"]) if "sample_id" in group else {}),
            }
        )
    return pd.DataFrame(rows)


def trace_summary(extras: Iterable[Any]) -> dict[str, float]:
    """Mean generated tokens of the samples' traces and the share that hit ``max_new_tokens``
    (``extra.trace``, stored by the runner); NaN where no sample has one."""
    traces = [extra["trace"] for extra in extras if isinstance(extra, dict) and extra.get("trace")]
    if not traces:
        return {"trace_tokens": float("nan"), "truncated": float("nan")}
    return {
        "trace_tokens": sum(t["generated_tokens"] for t in traces) / len(traces),
        "truncated": sum(bool(t["truncated"]) for t in traces) / len(traces),
    }
