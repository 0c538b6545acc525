"""The results summary's trace columns: re-selections while decoding and the generated tokens kept."""

from __future__ import annotations

import pandas as pd

from snapeval.results import summary_of
from snapeval.results.tables import render, summary_table


def sample(score: float, **trace) -> dict:
    base = {"generated_tokens": 100, "truncated": False}
    return {"score": score, "kv_bytes": 2**20, "extra": {"trace": base | trace}}


def test_the_summary_shows_re_selections_and_the_generated_share_kept():
    full = [sample(1.0, eviction_count=0, kept_generated_share=None)] * 2
    rkv = [
        sample(1.0, eviction_count=3, kept_generated_share=0.25),
        sample(0.0, eviction_count=6, kept_generated_share=0.5),
    ]
    rows = summary_table(
        pd.DataFrame(
            [{"method": "full", **summary_of(full)}, {"method": "rkv", "budget": 128.0, **summary_of(rkv)}]
        )
    )
    assert [(row["method"], row["evictions"], row["gen kept"]) for row in rows] == [
        ("full", "0.0", "-"),
        ("rkv", "4.5", "38%"),
    ]
    assert render(rows).splitlines()[0].endswith("|   trace tok |   truncated |   evictions |   gen kept |")


def test_rows_stored_before_re_selection_was_recorded_show_no_such_columns():
    old = [sample(1.0), sample(0.0)]  # traces without eviction_count or kept_generated_share
    [row] = summary_table(pd.DataFrame([{"method": "snapkv", **summary_of(old)}]))
    assert "evictions" not in row and "gen kept" not in row
    assert (row["trace tok"], row["truncated"]) == ("100", "0%")
