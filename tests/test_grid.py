"""One prefill for many cache settings (:class:`CacheGrid`), against each setting prefilled alone.

* Every member of a grid holds bit for bit the keys, values and positions its cache holds when it
  prefills the prompt alone, for all four methods over budgets, windows, kernels, poolings and GQA
  reductions, with and without a query appended after compression; the logits are those of the plain path.
* In the continuous batcher, requests that differ only in cache settings share one prefill call and
  answer exactly as each request alone.
"""

from __future__ import annotations

import pytest
import torch

from snapeval import continuous
from snapeval.cache import build_cache
from snapeval.cache.grid import CacheGrid
from snapeval.continuous import ContinuousBatcher, Request
from snapeval.errors import SnapevalError
from snapeval.generation import append_logits, generate, prefill_logits
from snapeval.models import encode_chat
from snapeval.sampling import Sampling

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
]
NOTES = " ".join(f"Note {n}: the code of box {n} is {1000 + 37 * n}." for n in range(40))


@pytest.fixture(scope="module")
def prompt(smollm) -> list[int]:
    question = "Which code does box 17 have? Answer with the number."
    return encode_chat(smollm.tokenizer, [{"role": "user", "content": f"{NOTES}\n{question}"}])


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
def test_every_grid_member_holds_what_its_cache_holds_alone(smollm, prompt, query_tokens):
    split = len(prompt) - query_tokens
    members = [build_cache(setting) for setting in SETTINGS]
    shared = prefill_logits(smollm.model, prompt[:split], CacheGrid(members))
    for setting, member in zip(SETTINGS, members, strict=True):
        alone = build_cache(setting)
        assert torch.equal(prefill_logits(smollm.model, prompt[:split], alone), shared)
        assert_same_cache(member, alone)
        if query_tokens:
            expected = append_logits(smollm.model, prompt[split:], alone)
            assert torch.equal(append_logits(smollm.model, prompt[split:], member), expected), setting
            assert_same_cache(member, alone)
    compressed = [m for m in members if m.method != "full"]
    assert all(m.kv_bytes() < members[0].kv_bytes() for m in compressed)  # the prompt was compressed


def test_a_grid_serves_one_prefill_only(smollm, prompt):
    grid = CacheGrid([build_cache({"method": "full"})])
    prefill_logits(smollm.model, prompt, grid)
    with pytest.raises(SnapevalError, match="one prefill"):
        prefill_logits(smollm.model, prompt[-2:], grid)


def test_requests_of_one_prompt_share_one_prefill_and_answer_as_alone(smollm, prompt, monkeypatch):
    calls = []
    real = continuous.prefill_logits
    monkeypatch.setattr(continuous, "prefill_logits", lambda *a: calls.append(a[2]) or real(*a))
    stops = frozenset({smollm.tokenizer.eos_token_id})
    requests = [
        Request(tuple(prompt), setting, 24, Sampling(index % 3 == 2, 0.8, 0.95, seed=5), stops, tag=index)
        for index, setting in enumerate(SETTINGS)
    ]
    got = {}
    ContinuousBatcher(smollm.model, rows=4).run(requests, lambda a: got.__setitem__(a.request.tag, a))
    assert len(calls) == 1 and isinstance(calls[0], CacheGrid)  # ten settings, one prefill
    assert len({answer.prefill_s for answer in got.values()}) == 1  # its seconds split ten ways
    for request in requests:
        reference = generate(
            smollm.model,
            list(request.prompt_ids),
            build_cache(request.cache),
            request.max_new_tokens,
            set(stops),
            request.sampling,
        )
        assert got[request.tag].tokens == reference.tokens, request.cache
    assert len({tuple(answer.tokens) for answer in got.values()}) > 1  # the settings do differ
