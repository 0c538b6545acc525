"""The engine against independent references written here from the methods' definitions.

* SnapKV selection == a naive loop implementation (random tensors and a model's attention).
* Decode logits of every compressing cache == the uncompressed model run with an eager attention whose
  per-layer, per-KV-head mask hides exactly what the definition says is evicted (sinks + recent for
  StreamingLLM; the reference selection + all/last-ring generated tokens for SnapKV/SnapStream).
* SAGE-KV selection == a naive loop over the last prompt query's softmax attention, per KV head; its decode
  == the masked model with sinks + top-k candidates + a recent window that rolls through the prompt's tail.
* StreamingLLM with ``rerotate`` == the same masked model where each row scores the sink keys rotated
  forward by its gap, so that every distance is the one between positions inside the cache; at a budget
  holding everything it is the uncompressed model (the other methods' holding budgets:
  tests/test_family_matrix.py).

The model is a tiny random-weight Llama (tests/conftest.py): the definitions hold for any weights.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from snapeval.cache import SageKVCache, SnapKVCache, SnapStreamCache, StreamingLLMCache
from snapeval.cache.attention import ATTENTION_NAME
from snapeval.cache.method import LayerPrompt

from .conftest import TINY_VOCAB

TOLERANCE = 1e-4
ROTATED_TOLERANCE = 2e-4  # float32 round-off of the re-rotated sink scores: ~1e-4 measured, 6e-14 in float64


def naive_window_attention(q, k, window):
    """Per query head, the causal softmax attention of the last ``window`` queries to every column, summed."""
    heads, length, dim = q.shape
    group = heads // k.shape[0]
    head_scores = []
    for h in range(heads):
        summed = [0.0] * length
        for i in range(length - window, length):
            logits = [float(q[h, i] @ k[h // group, j]) / math.sqrt(dim) for j in range(i + 1)]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            for j, w in enumerate(weights):
                summed[j] += w / total
        head_scores.append(summed)
    return head_scores


def reference_keep(q, k, window, kernel, pooling, gqa_reduce, keep, sinks=0):
    """Naive SnapKV(+sinks): q (H, L, d), k (Hkv, L, d) of one sequence -> sorted kept columns per KV head."""
    heads, length, _ = q.shape
    kv_heads = k.shape[0]
    group = heads // kv_heads
    prefix = length - window
    head_scores = []
    for summed in naive_window_attention(q, k, window):
        pooled = []
        for j in range(prefix):
            neighbours = [
                summed[n] if 0 <= n < prefix else None for n in range(j - kernel // 2, j + kernel // 2 + 1)
            ]
            if pooling == "max":
                pooled.append(max(x for x in neighbours if x is not None))
            else:
                pooled.append(sum(x or 0.0 for x in neighbours) / kernel)
        head_scores.append(pooled)
    kept = []
    for g in range(kv_heads):
        members = head_scores[g * group : (g + 1) * group]
        reduce = (lambda xs: sum(xs) / len(xs)) if gqa_reduce == "mean" else max
        scores = [reduce([m[j] for m in members]) for j in range(prefix)]
        forced = set(range(sinks)) | set(range(prefix, length))
        candidates = [j for j in range(prefix) if j not in forced]
        ranked = sorted(candidates, key=lambda j: (-scores[j], j))[: keep - len(forced)]
        kept.append(sorted(forced | set(ranked)))
    return kept


@pytest.mark.parametrize("pooling,gqa_reduce", [("max", "mean"), ("avg", "max")])
def test_snapkv_selection_matches_naive_reference_on_random_tensors(pooling, gqa_reduce):
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(1, 6, 40, 8, generator=generator)
    k = torch.randn(1, 2, 40, 8, generator=generator)
    valid = torch.ones(1, 40, dtype=torch.bool)
    cache = SnapKVCache(budget=20, window=6, kernel=5, pooling=pooling, gqa_reduce=gqa_reduce)
    selected = cache.select(LayerPrompt(k, q, valid, 1 / math.sqrt(8))).pinned[0].tolist()
    assert selected == reference_keep(q[0], k[0], 6, 5, pooling, gqa_reduce, keep=20)


def test_snapstream_selection_pins_sinks_and_window_on_random_tensors():
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 50, 8, generator=generator)
    k = torch.randn(1, 2, 50, 8, generator=generator)
    valid = torch.ones(1, 50, dtype=torch.bool)
    cache = SnapStreamCache(budget=30, window=5, kernel=3, sinks=2, ring=6)
    selection = cache.select(LayerPrompt(k, q, valid, 1 / math.sqrt(8)))
    assert selection.capacity == 30
    assert selection.pinned[0].tolist() == reference_keep(q[0], k[0], 5, 3, "max", "mean", keep=24, sinks=2)


def reference_sage_kv(q, k, sinks, recent, keep, window=1):
    """Naive SAGE-KV: q (H, L, d), k (Hkv, L, d) -> per KV head the sorted pinned columns (sinks + top-k).

    Each query head's softmax attention of the last ``window`` queries (causal) is summed; a KV head's
    score of a column is the mean over its query heads; candidates exclude the sinks and the last
    ``recent`` columns; ties go to the earlier column.
    """
    heads, length, _ = q.shape
    kv_heads = k.shape[0]
    group = heads // kv_heads
    head_scores = naive_window_attention(q, k, window)
    kept = []
    for g in range(kv_heads):
        members = head_scores[g * group : (g + 1) * group]
        scores = [sum(m[j] for m in members) / group for j in range(length)]
        candidates = range(sinks, length - recent)
        ranked = sorted(candidates, key=lambda j: (-scores[j], j))[: keep - sinks]
        kept.append(sorted(set(range(sinks)) | set(ranked)))
    return kept


@pytest.mark.parametrize("window", [1, 3])
def test_sage_kv_selection_matches_naive_reference_on_random_tensors(window):
    generator = torch.Generator().manual_seed(11)
    q = torch.randn(1, 6, 40, 8, generator=generator)
    k = torch.randn(1, 2, 40, 8, generator=generator)
    valid = torch.ones(1, 40, dtype=torch.bool)
    cache = SageKVCache(budget=20, sinks=3, recent=6, window=window)
    selection = cache.select(LayerPrompt(k, q, valid, 1 / math.sqrt(8)))
    assert selection.capacity == 20
    assert selection.pinned[0].tolist() == reference_sage_kv(q[0], k[0], 3, 6, keep=14, window=window)
    assert selection.ring[0].tolist() == [list(range(34, 40))] * 2  # the recent window, oldest first


# --- a model ----------------------------------------------------------------------------------------

PROMPT_LENGTH = 120
DECODE_STEPS = 40

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def prompt_ids():
    generator = torch.Generator().manual_seed(1)
    return torch.randint(3, TINY_VOCAB, (PROMPT_LENGTH,), generator=generator).tolist()


def run_cache(model, prompt_ids, cache, steps=DECODE_STEPS):
    """Greedy decode with ``cache``; returns generated tokens and the logits of each decode step."""
    tokens, step_logits = [], []
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt_ids]), past_key_values=cache).logits[0, -1]
        for _ in range(steps):
            token = int(logits.argmax())
            tokens.append(token)
            logits = model(input_ids=torch.tensor([[token]]), past_key_values=cache).logits[0, -1]
            step_logits.append(logits)
    return tokens, torch.stack(step_logits)


def capture_prefill(model, prompt_ids):
    """Post-RoPE queries and keys of every layer for the prompt, from an uncompressed prefill."""
    captured = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured[module.layer_idx] = (query[0].clone(), key[0].clone())
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    with _attention(model, "capture_for_test", capture), torch.inference_mode():
        model(input_ids=torch.tensor([prompt_ids]), past_key_values=DynamicCache())
    return captured


def rerotated_sink_scores(query, key, mask, sinks, inv_freq):
    """(1, heads, T, sinks) scores of every row against the sink keys rotated forward by the row's gap.

    A row's gap is its column minus its rank among the tokens it sees: the number of tokens evicted before
    it. transformers' RoPE: x cos + rotate_half(x) sin, each frequency used by dimensions i and i + d/2.
    """
    gaps = torch.arange(1, mask.shape[-1] + 1) - mask.sum(dim=-1)  # (1, heads, T)
    angles = gaps[..., None] * inv_freq  # (1, heads, T, d/2)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[..., None, :]  # (1, heads, T, 1, d)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[..., None, :]
    keys = key[:, :, None, :sinks]  # (1, heads, 1, sinks, d)
    half = keys.shape[-1] // 2
    rotate_half = torch.cat([-keys[..., half:], keys[..., :half]], dim=-1)
    rotated = keys * cos + rotate_half * sin  # (1, heads, T, sinks, d)
    return torch.einsum("bhtd,bhtsd->bhts", query, rotated)


def masked_logits(model, sequence, masks, rotated_sinks=0):
    """Logits of the uncompressed model over ``sequence`` with per-layer (kv_heads, T, T) boolean masks.

    With ``rotated_sinks``, every row scores the first ``rotated_sinks`` keys as
    :func:`rerotated_sink_scores` does (the original StreamingLLM's positions inside its cache).
    """
    head_dim = model.config.head_dim
    inv_freq = 1.0 / model.config.rope_parameters["rope_theta"] ** (torch.arange(0, head_dim, 2) / head_dim)

    def masked(module, query, key, value, attention_mask, scaling=None, **kwargs):
        group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
        mask = masks[module.layer_idx].repeat_interleave(group, 0)[None]
        logits = query @ key.transpose(-1, -2)
        if rotated_sinks:
            logits[..., :rotated_sinks] = rerotated_sink_scores(query, key, mask, rotated_sinks, inv_freq)
        logits = logits * (scaling or module.scaling)
        weights = logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return (weights @ value).transpose(1, 2).contiguous(), None

    with _attention(model, "masked_for_test", masked), torch.inference_mode():
        return model(input_ids=torch.tensor([sequence])).logits[0]


class _attention:
    """Temporarily switch ``model`` to a test attention function, then back to snapeval's."""

    def __init__(self, model, name, function):
        self.model, self.name = model, name
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, sdpa_mask)

    def __enter__(self):
        self.model.set_attn_implementation(self.name)

    def __exit__(self, *exc):
        self.model.set_attn_implementation(ATTENTION_NAME)


def definition_masks(length, total, kv_heads, layers, prompt_visible, decode_visible):
    """Causal full attention over the prompt; decode row c sees prompt_visible(l, g) + decode_visible(c)."""
    masks = {}
    for layer in range(layers):
        mask = torch.zeros(kv_heads, total, total, dtype=torch.bool)
        mask[:, :length, :length] = torch.ones(length, length, dtype=torch.bool).tril()
        for g in range(kv_heads):
            for row in range(length, total):
                mask[g, row, prompt_visible(layer, g)] = True
                mask[g, row, decode_visible(row)] = True
        masks[layer] = mask
    return masks


def assert_matches_definition(
    model, prompt_ids, cache, prompt_visible, decode_visible, rotated_sinks=0, tolerance=TOLERANCE
):
    tokens, logits = run_cache(model, prompt_ids, cache)
    sequence = prompt_ids + tokens
    length, total = len(prompt_ids), len(sequence)
    config = model.config
    masks = definition_masks(
        length, total, config.num_key_value_heads, config.num_hidden_layers, prompt_visible, decode_visible
    )
    reference = masked_logits(model, sequence, masks, rotated_sinks)[length:total]
    assert (logits - reference).abs().max().item() < tolerance
    return tokens


def test_streaming_llm_equals_full_attention_with_sinks_and_recent_mask(tiny_llama, prompt_ids):
    budget, sinks = 48, 4
    length = len(prompt_ids)
    assert length > budget
    assert_matches_definition(
        tiny_llama,
        prompt_ids,
        StreamingLLMCache(budget=budget, sinks=sinks),
        prompt_visible=lambda layer, g: list(range(sinks)),
        decode_visible=lambda row: [c for c in range(row - (budget - sinks) + 1, row + 1) if c >= sinks],
    )


def test_streaming_llm_rerotate_equals_masked_model_with_sinks_rotated_by_the_gap(tiny_llama, prompt_ids):
    budget, sinks = 48, 4
    assert len(prompt_ids) > budget  # the gap is positive from the first decode step on
    assert_matches_definition(
        tiny_llama,
        prompt_ids,
        StreamingLLMCache(budget=budget, sinks=sinks, rerotate=True),
        prompt_visible=lambda layer, g: list(range(sinks)),
        decode_visible=lambda row: [c for c in range(row - (budget - sinks) + 1, row + 1) if c >= sinks],
        rotated_sinks=sinks,
        tolerance=ROTATED_TOLERANCE,
    )


def test_snapkv_decode_equals_masked_full_model(tiny_llama, prompt_ids):
    window, kernel, budget = 8, 5, 48
    captured = capture_prefill(tiny_llama, prompt_ids)
    kept = {
        layer: reference_keep(q, k, window, kernel, "max", "mean", keep=budget)
        for layer, (q, k) in captured.items()
    }
    cache = SnapKVCache(budget=budget, window=window, kernel=kernel)
    length = len(prompt_ids)
    assert_matches_definition(
        tiny_llama,
        prompt_ids,
        cache,
        prompt_visible=lambda layer, g: kept[layer][g],
        decode_visible=lambda row: list(range(length, row + 1)),
    )
    for layer in kept:
        positions = cache.kept_positions(layer)[0]
        for g in range(positions.shape[0]):
            assert positions[g, :budget].tolist() == kept[layer][g]


def test_snapstream_decode_equals_masked_full_model_past_ring_wrap(tiny_llama, prompt_ids):
    window, kernel, sinks, ring, budget = 8, 5, 4, 16, 80
    captured = capture_prefill(tiny_llama, prompt_ids)
    kept = {
        layer: reference_keep(q, k, window, kernel, "max", "mean", keep=budget - ring, sinks=sinks)
        for layer, (q, k) in captured.items()
    }
    length = len(prompt_ids)
    assert length > budget - ring and ring < DECODE_STEPS  # really evicts, and the ring wraps
    assert_matches_definition(
        tiny_llama,
        prompt_ids,
        SnapStreamCache(budget=budget, window=window, kernel=kernel, sinks=sinks, ring=ring),
        prompt_visible=lambda layer, g: kept[layer][g],
        decode_visible=lambda row: [c for c in range(row - ring + 1, row + 1) if c >= length],
    )


def test_sage_kv_decode_equals_masked_full_model_past_recent_wrap(tiny_llama, prompt_ids):
    sinks, recent, budget = 4, 16, 64
    captured = capture_prefill(tiny_llama, prompt_ids)
    keep = budget - recent
    kept = {layer: reference_sage_kv(q, k, sinks, recent, keep) for layer, (q, k) in captured.items()}
    length = len(prompt_ids)
    assert length > budget - recent and recent < DECODE_STEPS  # really evicts, and the window rolls on
    assert_matches_definition(
        tiny_llama,
        prompt_ids,
        SageKVCache(budget=budget, sinks=sinks, recent=recent),
        prompt_visible=lambda layer, g: kept[layer][g],
        decode_visible=lambda row: list(range(row - recent + 1, row + 1)),
    )


def test_rerotate_with_a_budget_holding_everything_is_the_uncompressed_model(tiny_llama, prompt_ids):
    full_tokens, full_logits = run_cache(tiny_llama, prompt_ids, DynamicCache(), steps=32)
    tokens, logits = run_cache(
        tiny_llama, prompt_ids, StreamingLLMCache(budget=4096, rerotate=True), steps=32
    )
    assert tokens == full_tokens
    assert (logits - full_logits).abs().max().item() < TOLERANCE
