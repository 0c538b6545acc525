"""One prefill for many cache settings (:class:`CacheGrid`), against each setting prefilled alone.

* Every member of a grid holds bit for bit the keys, values and positions its cache holds when it
  prefills the prompt alone, for all four methods over budgets, windows, kernels, poolings and GQA
  reductions, with and without a query appended after compression; the logits are those of the plain path.
* In the continuous batcher, requests that differ only in cache settings share one prefill call, also
  when the rows are fewer than the settings, and answer exactly as each request alone (greedy and sampled).
* In the runner, every point of a grid is stored exactly as that point run alone (same config hash,
  outputs, scores, KV bytes, kept positions, fidelity), shared or not; an interrupted grid resumes with
  nothing lost and nothing computed twice; a malformed grid is rejected naming its field.

All on a tiny random-weight Llama (tests/conftest.py): equality of paths needs no trained weights.
"""

from __future__ import annotations

from datetime import datetime

import pytest
import torch

from snapeval.cache import build_cache
from snapeval.cache.grid import CacheGrid
from snapeval.configs.check import check
from snapeval.configs.grid import grid_points
from snapeval.decode.continuous import ContinuousBatcher, Request, prefills
from snapeval.decode.generation import append_logits, generate, prefill_logits
from snapeval.decode.sampling import Sampling
from snapeval.errors import SnapevalError
from snapeval.results import ResultsDB
from snapeval.run import evaluation, runner
from snapeval.run.evaluation import Evaluation

from .conftest import TINY_VOCAB, compose_config

SETTINGS = [
    {"method": "full"},
    {"method": "streaming_llm", "budget": 64, "sinks": 4},
    {"method": "streaming_llm", "budget": 48, "sinks": 2, "rerotate": True},
    {"method": "snapkv", "budget": 96, "window": 8, "kernel": 5},
    {"method": "snapkv", "budget": 96, "window": 16, "kernel": 5},
    {"method": "snapkv", "budget": 64, "window": 8, "kernel": 3, "pooling": "avg", "gqa_reduce": "max"},
    {"method": "snapkv", "ratio": 0.4, "window": 8, "kernel": 1},
    {"method": "snapstream", "budget": 128, "window": 8, "kernel": 5, "sinks": 4, "ring": 16},
    {"method": "snapstream", "budget": 96, "window": 16, "kernel": 7, "pooling": "avg", "ring": 8},
    {"method": "snapstream", "budget": 100, "window": 8, "kernel": 5, "sinks": 4, "ring": 16},
    {"method": "sage_kv", "budget": 96, "sinks": 4, "recent": 16},
    {"method": "sage_kv", "budget": 80, "sinks": 2, "recent": 24, "window": 8},
]
STOP = 151  # a token some settings draw early on this prompt: rows end at different steps

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return torch.randint(3, TINY_VOCAB, (300,), generator=torch.Generator().manual_seed(1)).tolist()


def assert_same_cache(member, alone) -> None:
    assert len(member.layers) == len(alone.layers)
    for ours, theirs in zip(member.layers, alone.layers, strict=True):
        assert torch.equal(ours.positions, theirs.positions)
        assert torch.equal(ours.keys, theirs.keys)
        assert torch.equal(ours.values, theirs.values)
        assert (ours.capacity, ours.ring_start, ours.ring_next) == (
            theirs.capacity,
            theirs.ring_start,
            theirs.ring_next,
        )


@pytest.mark.parametrize("query_tokens", [0, 12], ids=["whole-prompt", "query-appended"])
@torch.no_grad()
def test_every_grid_member_holds_what_its_cache_holds_alone(tiny_llama, prompt, query_tokens):
    split = len(prompt) - query_tokens
    members = [build_cache(setting) for setting in SETTINGS]
    shared = prefill_logits(tiny_llama, prompt[:split], CacheGrid(members))
    for setting, member in zip(SETTINGS, members, strict=True):
        alone = build_cache(setting)
        assert torch.equal(prefill_logits(tiny_llama, prompt[:split], alone), shared)
        assert_same_cache(member, alone)
        if query_tokens:
            expected = append_logits(tiny_llama, prompt[split:], alone)
            assert torch.equal(append_logits(tiny_llama, prompt[split:], member), expected), setting
            assert_same_cache(member, alone)
    compressed = [m for m in members if m.method != "full"]
    assert all(m.kv_bytes() < members[0].kv_bytes() for m in compressed)  # the prompt was compressed
    kept = {tuple(m.kept_positions(0)[0].flatten().tolist()) for m in compressed}
    assert len(kept) > 4  # the settings keep different tokens


def test_a_grid_serves_one_prefill_only(tiny_llama, prompt):
    grid = CacheGrid([build_cache({"method": "full"})])
    prefill_logits(tiny_llama, prompt, grid)
    with pytest.raises(SnapevalError, match="one prefill"):
        prefill_logits(tiny_llama, prompt[-2:], grid)


def test_requests_of_one_prompt_share_one_prefill_and_answer_as_alone(tiny_llama, prompt, monkeypatch):
    calls = []
    real = prefills.prefill_logits
    monkeypatch.setattr(prefills, "prefill_logits", lambda *a: calls.append(a[2]) or real(*a))
    stops = frozenset({STOP})
    requests = [
        Request(tuple(prompt), setting, 24, Sampling(index % 3 == 2, 0.8, 0.95, seed=5), stops, tag=index)
        for index, setting in enumerate(SETTINGS)
    ]
    got = {}
    ContinuousBatcher(tiny_llama, rows=4).run(requests, lambda a: got.__setitem__(a.request.tag, a))
    assert len(calls) == 1 and isinstance(calls[0], CacheGrid)  # twelve settings, one prefill
    assert len({answer.prefill_s for answer in got.values()}) == 1  # its seconds split twelve ways
    for request in requests:
        reference = generate(
            tiny_llama,
            list(request.prompt_ids),
            build_cache(request.cache),
            request.max_new_tokens,
            set(stops),
            request.sampling,
        )
        assert got[request.tag].tokens == reference.tokens, request.cache
    assert len({tuple(answer.tokens) for answer in got.values()}) > 1  # the settings do differ
    assert {answer.stopped for answer in got.values()} == {"eos", "length"}  # rows refilled mid-way


# --- grids in the runner ------------------------------------------------------------------------------

GRID = (
    "grid={cache: [full, streaming_llm, snapkv, snapstream],"
    " params: {budget: [192, 320], kernel: [3, 7], ring: 32}}"
)
POINTS = 1 + 2 + 4 + 4  # full and streaming_llm ignore the kernel
TASK = ("task=ruler_niah_single", "task.context_length=512", "run.limit=2", "task.max_new_tokens=12")
COMPARED = ("output", "score", "kv_bytes", "prompt_tokens", "generated_tokens", "target")


@pytest.fixture(scope="module")
def composed(tiny_llama_overrides):
    """The config of a run on the tiny Llama with its database in ``tmp_path``, then ``overrides``."""

    def compose(tmp_path, *overrides):
        db = f"run.db={tmp_path / 'db.sqlite'}"
        return compose_config(db, "run.progress=false", *tiny_llama_overrides, *TASK, *overrides)

    return compose


def stored_rows(path) -> dict[tuple[str, str], dict]:
    with ResultsDB(path) as db:
        rows = db.dataframe().to_dict("records")
        by_point = {}
        for run in db.runs_since(datetime(2000, 1, 1)):
            for sample in db.samples_for(run["config_hash"]):
                by_point[(run["config_hash"], sample["sample_id"])] = sample
    assert len(rows) == len(by_point)  # every (setting, sample) stored once
    return by_point


def same_rows(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for key, row in ours.items():
        other = theirs[key]
        assert {c: row[c] for c in COMPARED} == {c: other[c] for c in COMPARED}, key
        for field in ("kept_histogram", "trace", "fidelity", "compressed_prompt_tokens"):
            assert row["extra"].get(field) == other["extra"].get(field), (key, field)


@pytest.fixture(scope="module")
def alone(composed, tmp_path_factory) -> dict:
    """Every point of GRID run on its own, the full cache first (its outputs are the fidelity reference)."""
    tmp_path = tmp_path_factory.mktemp("alone")
    for point in grid_points(composed(tmp_path, GRID)):
        runner.run(point)
    return stored_rows(tmp_path / "db.sqlite")


def test_every_grid_point_is_stored_as_that_point_run_alone(composed, tmp_path, alone, monkeypatch):
    """All four methods over budget x kernel: one prefill per prompt, and every point's outputs, scores,
    KV bytes, kept positions, traces and fidelity equal its run alone. The full cache's answers arrive
    last (as when its answers are the longest): the other points' samples wait for them to be stored
    with their fidelity."""
    calls = []
    real = prefills.prefill_logits
    monkeypatch.setattr(prefills, "prefill_logits", lambda *a: calls.append(a[2]) or real(*a))
    real_run = ContinuousBatcher.run

    def full_answers_last(self, requests, on_answer, more=None, between_steps=None):
        held = []
        real_run(
            self,
            requests,
            lambda a: held.append(a) if a.request.cache.is_full else on_answer(a),
            more,
            between_steps,
        )
        for answer in held:
            assert not on_answer(answer)  # a one-pass task: no follow-up requests

    monkeypatch.setattr(ContinuousBatcher, "run", full_answers_last)
    summaries = runner.run(composed(tmp_path, GRID))
    assert len(summaries) == POINTS
    assert len(calls) == 2  # two prompts, one prefill each
    grid = stored_rows(tmp_path / "db.sqlite")
    same_rows(grid, alone)
    assert len({row["kv_bytes"] for row in grid.values()}) > 4 and any(
        not row["extra"]["fidelity"]["exact"] for row in grid.values() if "fidelity" in row["extra"]
    )  # the settings differ, and some lose agreement with the full cache


def test_a_grid_of_separate_points_stores_the_same_rows(composed, tmp_path, alone, monkeypatch):
    calls = []
    real = prefills.prefill_logits
    monkeypatch.setattr(prefills, "prefill_logits", lambda *a: calls.append(a[2]) or real(*a))
    runner.run(composed(tmp_path, GRID.replace("grid={", "grid={share_prefill: false, ")))
    assert len(calls) == 2 * POINTS and not any(isinstance(cache, CacheGrid) for cache in calls)
    same_rows(stored_rows(tmp_path / "db.sqlite"), alone)


def test_an_interrupted_grid_resumes_with_nothing_lost_or_computed_twice(
    composed, tmp_path, alone, monkeypatch
):
    stored = []
    real_store = Evaluation.commit

    def interrupted_after_ten(*args):
        if len(stored) == 10:
            raise KeyboardInterrupt
        stored.append(args[1].digest)
        return real_store(*args)

    monkeypatch.setattr(Evaluation, "commit", interrupted_after_ten)
    with pytest.raises(KeyboardInterrupt):
        runner.run(composed(tmp_path, GRID))
    monkeypatch.setattr(Evaluation, "commit", real_store)
    assert len(stored_rows(tmp_path / "db.sqlite")) == 10
    scored = []  # every sample generated is scored once
    real_row = evaluation.sample_row
    monkeypatch.setattr(evaluation, "sample_row", lambda *args: scored.append(args[1].id) or real_row(*args))
    resumed = runner.run(composed(tmp_path, GRID))
    assert len(scored) == sum(summary.computed for summary in resumed) == len(alone) - 10  # the missing
    assert all(summary.n == 2 for summary in resumed)
    same_rows(stored_rows(tmp_path / "db.sqlite"), alone)
    scored.clear()
    again = runner.run(composed(tmp_path, GRID))
    assert sum(summary.computed for summary in again) == len(scored) == 0


@pytest.mark.parametrize(
    "override,field",
    [
        ("grid={cache: [full, snapfast]}", "grid.cache"),
        ("grid={cache: [full, snapkv], params: {sinks: [2, 4]}}", "grid.params.sinks"),
        ("grid={cache: [full], colour: red}", "grid.colour"),
        ("grid={cache: [full], share_prefill: maybe}", "grid.share_prefill"),
    ],
)
def test_a_malformed_grid_is_rejected_naming_the_field(composed, tmp_path, override, field):
    with pytest.raises(SnapevalError) as raised:
        check(composed(tmp_path, override))
    assert raised.value.field == field


def test_cache_settings_outside_the_grid_are_rejected(composed, tmp_path):
    with pytest.raises(SnapevalError, match="grid.params") as raised:
        check(composed(tmp_path, "+exp=smoke", "cache.budget=100"))
    assert raised.value.field == "cache"


def test_a_grid_leaves_out_a_method_whose_extra_is_missing_and_says_so(monkeypatch, capsys):
    """``+exp=aime_budget_sweep`` names kvpress: where its extra is missing its points are left out with a
    note and the rest run; where it is there, its decoding point starts from kvpress's declared defaults
    (decoding on, the buffer size it did not name at kvpress's 256)."""
    from importlib import util

    from snapeval.run import plan

    cfg = compose_config("+exp=aime_budget_sweep", "run.limit=1")
    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "kvpress" else real(name, *a))
    points = grid_points(cfg)
    assert {point["cache"]["method"] for point in points} == {
        "full",
        "streaming_llm",
        "snapkv",
        "snapstream",
        "sage_kv",
        "rkv",
    }
    plan.check_extras(cfg, tuple(points))
    note = "note: grid.cache: kvpress left out: kvpress is not installed; pip install 'snapeval[kvpress]'"
    assert capsys.readouterr().err == note + "\n"
    monkeypatch.setattr(util, "find_spec", lambda name, *a: object() if name == "kvpress" else real(name, *a))
    kvpress = [point["cache"] for point in grid_points(cfg) if point["cache"]["method"] == "kvpress"]
    assert [cache["budget"] for cache in kvpress] == [128, 256]
    assert all(c["decoding"] and c["compression_interval"] == 64 for c in kvpress)
    assert all(c["hidden_states_buffer_size"] == 256 for c in kvpress)
