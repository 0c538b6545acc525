"""Speculative prefill against references written here: the chunk choice, importance carried across
tokenizers by character offsets, the draft's importance, and the target's decode == the plain model
prefilled with the kept tokens at their original positions."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache

from snapeval.cache import CacheGrid, SpeculativePrefillCache, build_cache
from snapeval.cache.speculative_prefill import Draft, carry_scores, chosen_columns, draft_importance
from snapeval.decode.generation import generate, prefill_logits
from snapeval.errors import SnapevalError
from snapeval.models import encode_chat

from .test_cache_reference import capture_prefill

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = (
    "Read the notes and answer. Note 1: the vault code is 4417. Note 2: the garden has seven apple trees "
    "and a small pond with orange fish. Note 3: the library opens at nine and closes at five, except on "
    "Sundays. Note 4: the train to the coast leaves every forty minutes from platform two. Note 5: the "
    "baker sells rye bread on Tuesdays. Question: what is the vault code? Explain briefly."
)

TOLERANCE = 1e-4


def test_chunks_are_ranked_by_mean_score_and_the_question_is_always_kept():
    scores = torch.tensor([0.0, 0.0, 0.0, 5.0, 1.0, 1.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    # window 2 keeps columns 10, 11; the rest in chunks of 3, best first: [6-8] 3, [3-5] 7/3, [0-2] 0, [9] 0
    assert chosen_columns(scores, keep=8, chunk=3, window=2) == [3, 4, 5, 6, 7, 8, 10, 11]
    assert chosen_columns(scores, keep=6, chunk=3, window=2) == [3, 6, 7, 8, 10, 11]  # second chunk cut short
    tied = torch.zeros(12)
    assert chosen_columns(tied, keep=5, chunk=3, window=2) == [0, 1, 2, 10, 11]  # ties: the earlier chunk


def test_importance_travels_between_two_tokenizers_by_character_offsets(tiny_llama_chat):
    text = PROMPT
    encoded = tiny_llama_chat.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    words = encoded["offset_mapping"]
    characters = [(i, i + 1) for i in range(len(text))]  # a character-level tokenizer
    generator = torch.Generator().manual_seed(5)
    per_character = torch.rand(len(text), generator=generator)
    carried = carry_scores(characters, per_character, words)
    assert carried.tolist() == pytest.approx([float(per_character[a:b].max()) for a, b in words])
    per_word = torch.rand(len(words), generator=generator)
    back = carry_scores(words, per_word, characters)
    owner = {c: i for i, (a, b) in enumerate(words) for c in range(a, b)}
    assert back.tolist() == pytest.approx(
        [float(per_word[owner[c]]) if c in owner else 0.0 for c in range(len(text))]
    )
    assert len(words) < len(text) / 3  # really two different tokenizations


def test_draft_importance_equals_attention_averaged_over_heads_and_layers(tiny_llama_chat):
    ids = encode_chat(tiny_llama_chat.tokenizer, [{"role": "user", "content": PROMPT}])
    window, kernel = 6, 5
    captured = capture_prefill(tiny_llama_chat.model, ids)
    length = len(ids)
    layers = []
    for query, key in captured.values():  # (heads, L, d), (kv_heads, L, d)
        key = key.repeat_interleave(query.shape[0] // key.shape[0], 0)
        logits = query[:, -window:] @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
        rows = torch.arange(length - window, length)[:, None]
        logits = logits.masked_fill(torch.arange(length)[None, :] > rows, float("-inf"))
        layers.append(logits.softmax(dim=-1).sum(dim=1).mean(dim=0))
    mean = torch.stack(layers).mean(dim=0)
    expected = [sum(mean[j] for j in range(i - 2, i + 3) if 0 <= j < length) / kernel for i in range(length)]
    scores = draft_importance(Draft(tiny_llama_chat.model), ids, window, kernel)
    assert scores.tolist() == pytest.approx([float(x) for x in expected], abs=1e-6)
    # the cross-family path, with a draft whose tokenizer happens to be the target's, carries them unchanged
    crossed = draft_importance(
        Draft(tiny_llama_chat.model, tiny_llama_chat.tokenizer, tiny_llama_chat.tokenizer),
        ids,
        window,
        kernel,
    )
    assert torch.allclose(crossed, scores)


def reference_decode(model, ids, columns, steps):
    """The plain model, prefilled with the kept tokens at their original positions, decoding greedily."""
    cache, tokens, step_logits = DynamicCache(), [], []
    with torch.inference_mode():
        kept = torch.tensor([[ids[c] for c in columns]])
        logits = model(input_ids=kept, position_ids=torch.tensor([columns]), past_key_values=cache).logits[
            0, -1
        ]
        for position in range(len(ids), len(ids) + steps):
            tokens.append(int(logits.argmax()))
            step = torch.tensor([[tokens[-1]]])
            logits = model(input_ids=step, position_ids=torch.tensor([[position]]), past_key_values=cache)
            logits = logits.logits[0, -1]
            step_logits.append(logits)
    return tokens, torch.stack(step_logits)


def speculative_decode(model, ids, cache, steps):
    """Greedy decode after snapeval's prefill (which lets the cache choose what to prefill)."""
    tokens, step_logits = [], []
    with torch.inference_mode():
        logits = prefill_logits(model, ids, cache)[-1]
        for _ in range(steps):
            tokens.append(int(logits.argmax()))
            logits = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache).logits[0, -1]
            step_logits.append(logits)
    return tokens, torch.stack(step_logits)


def test_target_decode_equals_the_model_prefilled_with_the_kept_tokens_at_their_positions(tiny_llama_chat):
    ids = encode_chat(tiny_llama_chat.tokenizer, [{"role": "user", "content": PROMPT}])
    cache = SpeculativePrefillCache(budget=48, window=8, chunk=8)
    tokens, logits = speculative_decode(tiny_llama_chat.model, ids, cache, steps=24)
    assert len(cache.columns) == 48 and cache.columns[-8:] == list(range(len(ids) - 8, len(ids)))
    ref_tokens, ref_logits = reference_decode(tiny_llama_chat.model, ids, cache.columns, steps=24)
    assert tokens == ref_tokens
    assert (logits - ref_logits).abs().max().item() < TOLERANCE
    held = cache.kept_positions(0)[0, 0].tolist()
    assert held == cache.columns + list(range(len(ids), len(ids) + 24))  # the prompt's own columns


def test_a_budget_holding_the_prompt_reproduces_the_full_cache(tiny_llama_chat):
    ids = encode_chat(tiny_llama_chat.tokenizer, [{"role": "user", "content": PROMPT}])
    full = generate(tiny_llama_chat.model, ids, DynamicCache(), 24, set())
    cache = SpeculativePrefillCache(budget=len(ids))
    speculative = generate(tiny_llama_chat.model, ids, cache, 24, set())
    assert speculative.tokens == full.tokens and cache.columns is None


def test_the_runner_stores_the_share_kept_and_the_prefill_seconds_with_the_draft(
    tiny_llama_overrides, tmp_path
):
    from snapeval.results import load
    from snapeval.run import runner

    from .conftest import compose_config

    cfg = compose_config(
        f"run.db={tmp_path / 'db.sqlite'}",
        *tiny_llama_overrides,
        "run.progress=false",
        "cache=speculative_prefill",
        "cache.budget=128",
        "task.context_length=512",
        "run.limit=2",
    )
    [summary] = runner.run(cfg)
    samples = load(tmp_path / "db.sqlite")
    for extra, prompt_tokens in zip(samples["extra"], samples["prompt_tokens"], strict=True):
        assert extra["kept_share"] == pytest.approx(128 / prompt_tokens)
    assert summary.n == 2 and (samples["prefill_s"] > 0).all()


def test_a_missing_draft_and_a_shared_prefill_are_refused(tiny_llama_chat):
    ids = encode_chat(tiny_llama_chat.tokenizer, [{"role": "user", "content": PROMPT}])
    cache = build_cache({"method": "speculative_prefill", "budget": 32, "draft": "qwen2.5-7b-instruct"})
    with pytest.raises(SnapevalError, match="cache.draft: no draft model 'qwen2.5-7b-instruct'"):
        cache.prefill_input(tiny_llama_chat.model, ids)
    with pytest.raises(SnapevalError, match="cannot share a prefill"):
        CacheGrid([SpeculativePrefillCache(budget=32), build_cache({"method": "full"})])
    with pytest.raises(SnapevalError, match="cache.kernel"):
        SpeculativePrefillCache(budget=32, kernel=4)
