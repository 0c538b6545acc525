"""What a sample's row records of its trace: its length and end, and where and how much a cache that
compresses while decoding evicted (the answer's re-selection steps and kept shares)."""

from __future__ import annotations

from snapeval.decode.continuous import Answer, Request
from snapeval.results import load
from snapeval.run import runner
from snapeval.run.records import trace

from .conftest import compose_config


class Letters:
    """A tokenizer of one letter per id (``a`` is 0), enough for what a trace decodes."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def answer(**fields) -> Answer:
    request = Request(prompt_ids=(1, 2, 3), cache={"method": "rkv", "budget": 16}, max_new_tokens=5)
    defaults = {"prefill_s": 0.1, "decode_s": 0.2, "kv_bytes": 1024, "ring_wraps": 0, "kept_histogram": None}
    return Answer(request, [0, 1, 2, 3, 4], "length", **(defaults | fields))


def test_a_trace_records_each_re_selection_step_and_the_shares_kept():
    recorded = trace(Letters(), answer(evictions=(2, 4), kept_share=0.25, kept_generated_share=0.6))
    assert recorded == {
        "generated_tokens": 5,
        "stopped": "length",
        "truncated": True,
        "reasoning_closed": False,
        "ring_wraps": 0,
        "evictions": [2, 4],
        "eviction_count": 2,
        "first_eviction_step": 2,
        "kept_prompt_share": 0.25,
        "kept_generated_share": 0.6,
    }


def test_a_trace_without_re_selection_records_none():
    recorded = trace(Letters(), answer())  # the full cache: nothing evicted, no shares
    assert (recorded["evictions"], recorded["eviction_count"], recorded["first_eviction_step"]) == (
        [],
        0,
        None,
    )
    assert recorded["kept_prompt_share"] is None and recorded["kept_generated_share"] is None


def test_a_grid_stores_where_each_row_was_re_selected(tiny_llama_overrides, tmp_path, one_torch_thread):
    """R-KV (rows of 64 + 8 slots) and SnapStream re-selecting every 4 steps once its ring of 16 is full,
    beside the full cache, on a tiny random Llama: every stored trace holds its answer's re-selections."""
    grid = ("+grid.cache=[full,rkv,snapstream]", "+grid.params={budget:64,buffer:8,ring:16,reselect_every:4}")
    run = ("run.limit=2", "run.progress=false", f"run.db={tmp_path / 'db.sqlite'}")
    task = ("task.context_length=256", "task.max_new_tokens=40")
    runner.run(compose_config(*tiny_llama_overrides, *run, *task, *grid))
    frame = load(tmp_path / "db.sqlite")
    assert sorted(frame["method"]) == ["full", "full", "rkv", "rkv", "snapstream", "snapstream"]
    for method, extra in zip(frame["method"], frame["extra"], strict=True):
        trace, generated = extra["trace"], extra["trace"]["generated_tokens"]
        steps = trace["evictions"]
        assert trace["eviction_count"] == len(steps) and trace["first_eviction_step"] == (steps or [None])[0]
        if method == "full":
            assert steps == [] and trace["kept_prompt_share"] is trace["kept_generated_share"] is None
            continue
        first, every = {"rkv": (8, 8), "snapstream": (16, 4)}[method]  # the buffer; the ring, then every 4
        assert steps == list(range(first, generated, every)), (method, generated)
        assert trace["kept_prompt_share"] == extra["kept_share"] < 1
        assert 0 < trace["kept_generated_share"] < 1
