"""R-KV against a naive reference written here from the authors' definition (Zefan-Cai/R-KV, ``R1KV`` and
``cal_similarity``), with Python loops per head and token:

* importance, redundancy (the threshold rule included), final scores and kept slots on random tensors;
  the engine's re-selection and a padded batch row give the same;
* the prefill selection of a tiny Llama's prompt, from its own queries and keys;
* a budget that holds everything gives the full cache's greedy tokens (Llama and MLA);
* while decoding, the engine's tokens and kept positions equal a plain transformers loop that evicts
  with the naive scores whenever the cache holds budget + buffer tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from snapeval.cache import build_cache, install
from snapeval.cache import redundancy as redundancy_module
from snapeval.cache.attention import ATTENTION_NAME
from snapeval.cache.method import LayerPrompt
from snapeval.cache.redundancy import importance, kept_slots, redundancy, rkv_scores
from snapeval.cache.rkv import RKVCache
from snapeval.decode.continuous import Request
from snapeval.decode.generation import generate
from snapeval.decode.sampling import Sampling
from tests.families import FAMILIES

from .batched import answers_equal_alone
from .conftest import TINY_VOCAB

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# --- the naive reference: one sequence, Python floats -------------------------------------------------


def naive_importance(q, k, kernel, scaling):
    """q (H, w, d), k (Hkv, S, d) -> per KV head the pooled importance of the S - w keys before the window."""
    heads, window, _ = q.shape
    kv_heads, length, _ = k.shape
    group, prefix = heads // kv_heads, length - window
    q, k = q.tolist(), k.tolist()
    pooled = []
    for g in range(kv_heads):
        mean = [0.0] * prefix
        for i in range(window):
            logits = []
            for j in range(prefix):
                dots = [
                    sum(a * b for a, b in zip(q[h][i], k[g][j], strict=True)) * scaling
                    for h in range(g * group, (g + 1) * group)
                ]
                logits.append(max(dots))
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            for j in range(prefix):
                mean[j] += weights[j] / sum(weights) / window
        half = kernel // 2
        pooled.append([max(mean[max(0, j - half) : j + half + 1]) for j in range(prefix)])
    return pooled


def naive_redundancy(k, threshold):
    """k (Hkv, S, d) -> per KV head the softmax over keys of the mean cosine similarity, with the diagonal
    and, per row, the last column above ``threshold`` (column 0 if none) zeroed."""
    result = []
    for head in k.tolist():
        normed = [[x / (math.sqrt(sum(y * y for y in key)) + 1e-8) for x in key] for key in head]
        length = len(normed)
        columns = [0.0] * length
        for i in range(length):
            row = [
                0.0 if i == j else sum(a * b for a, b in zip(normed[i], normed[j], strict=True))
                for j in range(length)
            ]
            above = [j for j in range(length) if row[j] > threshold]
            row[max(above) if above else 0] = 0.0
            for j in range(length):
                columns[j] += row[j] / length
        top = max(columns)
        weights = [math.exp(x - top) for x in columns]
        result.append([w / sum(weights) for w in weights])
    return result


def naive_rkv(q, k, window, kernel, mix_lambda, threshold, scaling, keep):
    """Final scores and kept slots per KV head: the best keep - window before the window, then the window."""
    prefix = k.shape[1] - window
    weights = naive_importance(q[:, -window:], k, kernel, scaling)
    similar = naive_redundancy(k, threshold)
    scores = [
        [mix_lambda * w - (1 - mix_lambda) * s for w, s in zip(head_w, head_s[:prefix], strict=True)]
        for head_w, head_s in zip(weights, similar, strict=True)
    ]
    kept = [
        sorted(range(prefix), key=lambda j: -head[j])[: keep - window] + list(range(prefix, prefix + window))
        for head in scores
    ]
    return scores, kept


def random_heads(length=40, dim=8, seed=5):
    """float64 queries (1, 4, length, dim) and keys (1, 2, length, dim), some keys near copies of earlier
    ones, so that the threshold rule has look-alikes to find."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, length, dim, generator=generator, dtype=torch.float64)
    k = torch.randn(1, 2, length, dim, generator=generator, dtype=torch.float64)
    for copy, original in [(12, 3), (30, 3), (25, 20), (33, 8)]:
        k[:, :, copy] = k[:, :, original] + 0.1 * torch.randn(
            1, 2, dim, generator=generator, dtype=torch.float64
        )
    return q, k


@pytest.mark.parametrize("kernel,threshold", [(3, 0.5), (7, 0.5), (7, 0.0), (3, -0.2), (7, 1.0)])
def test_scores_and_kept_slots_match_the_naive_reference(kernel, threshold):
    q, k = random_heads()
    window, keep, mix_lambda, scaling = 4, 20, 0.1, 1 / math.sqrt(8)
    expected_scores, expected_kept = naive_rkv(
        q[0], k[0], window, kernel, mix_lambda, threshold, scaling, keep
    )
    queries = q[:, :, -window:]
    torch.testing.assert_close(
        importance(queries, k, kernel, scaling)[0],
        torch.tensor(naive_importance(q[0, :, -window:], k[0], kernel, scaling), dtype=torch.float64),
    )
    torch.testing.assert_close(
        redundancy(k, threshold)[0], torch.tensor(naive_redundancy(k[0], threshold), dtype=torch.float64)
    )
    scores = rkv_scores(queries, k, kernel, mix_lambda, threshold, scaling)
    torch.testing.assert_close(scores[0], torch.tensor(expected_scores, dtype=torch.float64))
    assert kept_slots(scores, keep, window)[0].tolist() == expected_kept
    # the engine's decode-time re-selection: the held slots, the last window's queries recorded
    cache = RKVCache(budget=keep, buffer=20, window=window, kernel=kernel, threshold=threshold)
    held = LayerPrompt(k, queries, torch.ones(1, 40, dtype=torch.bool), scaling)
    assert cache.reselect(held, keep)[0].tolist() == expected_kept


def test_redundancy_in_chunks_of_rows_is_the_whole_matrix(monkeypatch):
    _, k = random_heads()
    monkeypatch.setattr(redundancy_module, "CHUNK_ENTRIES", 2 * 7 * 40)  # 7 rows: 6 chunks, the last of 5
    torch.testing.assert_close(
        redundancy(k, 0.5)[0], torch.tensor(naive_redundancy(k[0], 0.5), dtype=torch.float64)
    )


def test_the_threshold_rule_changes_the_redundancy():
    """Without the rule (a threshold no similarity exceeds, so only column 0 is zeroed) the near copies
    count as redundant; with it each key's last look-alike does not."""
    _, k = random_heads()
    assert not torch.allclose(redundancy(k, 0.5), redundancy(k, 1.0))
    assert not torch.allclose(redundancy(k, 0.5), redundancy(k, 0.0))


def test_a_padded_batch_row_selects_what_it_selects_alone():
    q, k = random_heads(length=36)
    pad = 5
    padded_q = torch.cat([torch.randn(1, 4, pad, 8, dtype=torch.float64), q], dim=2).repeat(2, 1, 1, 1)
    # row 0's padding keys are copies of its real keys: look-alikes that must not count
    padded_k = torch.cat([k[:, :, 10 : 10 + pad], k], dim=2).repeat(2, 1, 1, 1)
    padded_q[1, :, :pad], padded_k[1, :, :pad] = q[0, :, :pad], k[0, :, :pad]  # row 1: 41 real tokens
    valid = torch.ones(2, 36 + pad, dtype=torch.bool)
    valid[0, :pad] = False
    cache = RKVCache(budget=20, buffer=8, window=4, kernel=5, threshold=0.9)
    alone_prompt = LayerPrompt(k, q, torch.ones(1, 36, dtype=torch.bool), 1 / math.sqrt(8))
    batched_prompt = LayerPrompt(padded_k, padded_q, valid, 1 / math.sqrt(8))
    priority = cache.priority(batched_prompt)
    torch.testing.assert_close(priority[0, :, pad:], cache.priority(alone_prompt)[0])
    assert priority[0, :, :pad].eq(float("-inf")).all()
    alone, batched = cache.select(alone_prompt), cache.select(batched_prompt)
    assert batched.capacity == alone.capacity == 28
    assert (batched.pinned[0] - pad).tolist() == alone.pinned[0].tolist()
    _, expected = naive_rkv(padded_q[1], padded_k[1], 4, 5, 0.1, 0.9, 1 / math.sqrt(8), 20)
    assert batched.pinned[1].tolist() == [sorted(head) for head in expected]


# --- a model ------------------------------------------------------------------------------------------


class capture_attention:
    """Switch ``model`` to an SDPA attention that records each layer's post-RoPE queries and keys (and,
    for one-token steps, attends to every cached key), then back to snapeval's."""

    def __init__(self, model):
        self.model, self.captured = model, {}
        AttentionInterface.register("rkv_capture_for_test", self.attend)
        AttentionMaskInterface.register("rkv_capture_for_test", sdpa_mask)

    def attend(self, module, query, key, value, attention_mask, scaling=None, **kwargs):
        self.captured[module.layer_idx] = (query[0].clone(), key[0].clone())
        group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
        causal = query.shape[2] > 1
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, is_causal=causal, scale=scaling
        )
        return out.transpose(1, 2).contiguous(), None

    def __enter__(self):
        self.model.set_attn_implementation("rkv_capture_for_test")
        return self.captured

    def __exit__(self, *exc):
        self.model.set_attn_implementation(ATTENTION_NAME)


def prompt_ids(length, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, TINY_VOCAB, (length,), generator=generator).tolist()


def test_prefill_selection_of_a_model_prompt_matches_the_naive_reference(tiny_llama):
    ids = prompt_ids(30)
    with capture_attention(tiny_llama) as captured, torch.inference_mode():
        tiny_llama(input_ids=torch.tensor([ids]), past_key_values=DynamicCache())
    cache = RKVCache(budget=16, buffer=8, window=4, kernel=7)
    with torch.inference_mode():
        tiny_llama(input_ids=torch.tensor([ids]), past_key_values=cache)
    for layer, (q, k) in captured.items():
        scaling = tiny_llama.model.layers[layer].self_attn.scaling
        _, kept = naive_rkv(q.double(), k.double(), 4, 7, 0.1, 0.5, scaling, 16)
        positions = cache.kept_positions(layer)[0]
        assert positions[:, :16].tolist() == [sorted(head) for head in kept]
        assert positions[:, 16:].eq(-1).all()  # the buffer: 8 empty slots


@pytest.mark.parametrize("family", ["llama", "gemma2", "deepseek_v3"])
def test_a_budget_holding_everything_is_the_full_cache(family, tiny_llama):
    """70 prompt tokens and 20 generated in rows of 100 + 8 slots: never cut, never re-selected (Gemma 2's
    sliding layers hold their window of 64 as with the full cache)."""
    model = tiny_llama if family == "llama" else install(FAMILIES[family](TINY_VOCAB))
    model.generation_config.eos_token_id = None
    ids = prompt_ids(70, seed=2)
    full = generate(model, ids, build_cache({"method": "full"}), 20, set()).tokens
    held = generate(
        model, ids, build_cache({"method": "rkv", "budget": 90, "buffer": 8, "window": 4}), 20, set()
    )
    assert held.tokens == full and len(full) == 20


def test_an_mla_prompt_is_cut_to_the_budget_in_latent_space():
    """DeepSeek-V3: one latent cache head, scored with absorbed queries; the window is kept."""
    model = install(FAMILIES["deepseek_v3"](TINY_VOCAB))
    cache = RKVCache(budget=12, buffer=8, window=4, kernel=3)
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt_ids(30)]), past_key_values=cache)
    for layer in range(2):
        positions = cache.kept_positions(layer)[0]
        assert positions.shape == (1, 20)
        kept = positions[0, :12].tolist()
        assert kept == sorted(kept) and kept[-4:] == [26, 27, 28, 29] and len(set(kept)) == 12
        assert positions[0, 12:].eq(-1).all()


# --- while decoding -----------------------------------------------------------------------------------


class record_queries(capture_attention):
    """:class:`capture_attention` that also keeps each layer's queries of every one-token step."""

    def __init__(self, model):
        super().__init__(model)
        self.steps: dict[int, list[torch.Tensor]] = {}

    def attend(self, module, query, key, value, attention_mask, scaling=None, **kwargs):
        if query.shape[2] == 1:
            self.steps.setdefault(module.layer_idx, []).append(query[0, :, 0].clone())
        return super().attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


def gather_layer(layer, columns, orders):
    """Keep the slots ``orders`` names per KV head, in that order, of a DynamicCache layer and its columns."""
    index = torch.tensor([orders])[..., None].expand(-1, -1, -1, layer.keys.shape[-1])
    layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
    return [[head[slot] for slot in order] for head, order in zip(columns, orders, strict=True)]


def naive_generation(model, prompt, steps, budget, buffer, window, kernel):
    """Greedy decoding on a plain DynamicCache with R-KV by the naive reference: the prompt cut to
    ``budget`` (ascending columns), then each layer gathered in the reference's order whenever it holds
    ``budget + buffer`` tokens. Returns the tokens, each layer's columns per KV head, the eviction steps."""
    cache = DynamicCache()
    scalings = [layer.self_attn.scaling for layer in model.model.layers]
    heads = model.config.num_key_value_heads
    recorder = record_queries(model)
    with recorder as captured, torch.inference_mode():
        logits = model(torch.tensor([prompt]), past_key_values=cache).logits[0, -1]
        columns = []
        for index, layer in enumerate(cache.layers):
            q, k = captured[index]
            _, kept = naive_rkv(q.double(), k.double(), window, kernel, 0.1, 0.5, scalings[index], budget)
            columns.append(gather_layer(layer, [list(range(len(prompt)))] * heads, [sorted(h) for h in kept]))
        tokens, evictions = [], []
        for step in range(1, steps + 1):
            tokens.append(int(logits.argmax()))
            position = torch.tensor([[len(prompt) + step - 1]])
            logits = model(torch.tensor([tokens[-1:]]), past_key_values=cache, position_ids=position).logits
            logits = logits[0, -1]
            columns = [[head + [len(prompt) + step - 1] for head in layer] for layer in columns]
            if len(columns[0][0]) < budget + buffer:
                continue
            evictions.append(step)
            for index, layer in enumerate(cache.layers):
                queries = torch.stack(recorder.steps[index][-window:], dim=1).double()  # (heads, w, d)
                args = (window, kernel, 0.1, 0.5, scalings[index], budget)
                _, kept = naive_rkv(queries, layer.keys[0].double(), *args)
                columns[index] = gather_layer(layer, columns[index], kept)
    return tokens, columns, evictions


def test_decoding_re_selects_as_the_naive_reference_does(tiny_llama):
    """A 30-token prompt cut to 16, then rows of 16 + 8 slots cut back to 16 every 8 steps: the same
    tokens, re-selections and kept columns (in storage order) as the naive loop."""
    ids, steps = prompt_ids(30, seed=3), 40
    expected, columns, evictions = naive_generation(tiny_llama, ids, steps, 16, 8, 4, 7)
    cache = build_cache({"method": "rkv", "budget": 16, "buffer": 8, "window": 4})
    got = generate(tiny_llama, ids, cache, steps + 1, set())
    assert got.tokens[:steps] == expected
    assert evictions == [8, 16, 24, 32, 40]
    for index, layer in enumerate(cache.layers):
        assert layer.positions[0, :, : layer.filled].tolist() == columns[index]
        assert bool((layer.positions[0, :, layer.filled :] == -1).all())


def test_an_mla_row_is_re_selected_in_latent_space():
    """DeepSeek-V3 decoding 30 tokens after a 30-token prompt, rows of 12 + 6: re-selected at steps 6,
    12, ..., each keeping 8 scored tokens then the last 4 fed, in storage order, then new tokens."""
    model = install(FAMILIES["deepseek_v3"](TINY_VOCAB))
    model.generation_config.eos_token_id = None
    cache = build_cache({"method": "rkv", "budget": 12, "buffer": 6, "window": 4, "kernel": 3})
    assert len(generate(model, prompt_ids(30), cache, 30, set()).tokens) == 30
    for layer in cache.layers:  # 29 steps fed: the last re-selection at step 24, 5 fed since
        held = layer.positions[0, 0, : layer.filled].tolist()
        assert held[8:] == list(range(50, 59)) and len(set(held)) == 17 and max(held[:8]) < 50


def test_batched_rows_and_a_grid_of_settings_answer_as_one_by_one(tiny_llama):
    """Prompts of 10-30 tokens (some cut at prefill, some not), two R-KV settings per prompt sharing its
    prefill, next to full-cache rows, some sampled, 3 rows refilled: every answer's tokens are those of
    its request alone, and R-KV rows report their re-selections."""
    generator = torch.Generator().manual_seed(4)
    settings = [
        {"method": "rkv", "budget": 16, "buffer": 8, "window": 4},
        {"method": "rkv", "budget": 20, "buffer": 6, "window": 3, "kernel": 3, "threshold": 0.2},
    ]
    requests = []
    for index in range(4):
        length = int(torch.randint(10, 31, (1,), generator=generator))
        ids = tuple(torch.randint(3, TINY_VOCAB, (length,), generator=generator).tolist())
        sampling = Sampling(do_sample=index % 2 == 1, temperature=0.8, seed=index)
        for n, cache in enumerate([*settings, {"method": "full"}]):
            requests.append(Request(ids, cache, 30, sampling, tag=(index, n)))
    got = answers_equal_alone(tiny_llama, requests)
    assert all(len(got[r.tag].evictions) >= 2 for r in requests if r.cache.method == "rkv")
