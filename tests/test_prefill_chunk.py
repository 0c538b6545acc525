"""Chunked prefill (``cache.prefill_chunk``): a prompt prefilled N tokens at a time, each chunk attending
to what the cache holds and the method selecting again from that and the chunk.

* N at least the prompt's length is today's whole prefill, every method, token for token and slot for
  slot; a smaller N changes nothing but numerics for the full cache (on sliding-window and MLA models too).
* SnapKV, SnapStream and StreamingLLM hold at most their budget after every chunk, and chunking shows
  (SnapKV's and SnapStream's kept slots, StreamingLLM's answers); a ratio is a share of the whole prompt.
* SnapKV's slots after chunk 2 are a plain-torch selection from chunk 2's window queries over the held
  slots and the chunk.
* The batcher prefills a chunked setting on its own and answers as the single-sequence path does.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from snapeval.cache import CacheGrid, SnapevalCache, build_cache, install
from snapeval.cache.scoring import window_attention
from snapeval.configs.setting import check_cache
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.generation import generate, prompt_logits
from snapeval.errors import SnapevalError
from tests.families import FAMILIES

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

VOCAB, LENGTH, CHUNK, NEW = 320, 100, 16, 12
METHODS = {
    "full": {"method": "full"},
    "snapkv": {"method": "snapkv", "budget": 40, "window": 4, "kernel": 3},
    "snapstream": {"method": "snapstream", "budget": 48, "window": 4, "kernel": 3, "sinks": 2, "ring": 8},
    "streaming_llm": {"method": "streaming_llm", "budget": 32, "sinks": 2},
    "sage_kv": {"method": "sage_kv", "budget": 40, "sinks": 2, "recent": 8, "window": 2},
    "rkv": {"method": "rkv", "budget": 40, "buffer": 16, "window": 4},
}


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return model_of("llama")


def model_of(family: str) -> torch.nn.Module:
    model = install(FAMILIES[family](VOCAB))
    model.generation_config.eos_token_id = None
    return model


def prompt(length: int = LENGTH, seed: int = 0) -> list[int]:
    return torch.randint(3, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def chunked(node: dict, chunk: int | None) -> dict:
    return node if chunk is None else {**node, "prefill_chunk": chunk}


def answer(model, ids, node, chunk=None, new=NEW):
    """Greedy tokens, the first token's logits and the cache, prefilled whole or in chunks."""
    cache = build_cache(chunked(node, chunk))
    with torch.inference_mode():
        logits = prompt_logits(model, ids, build_cache(chunked(node, chunk)))[-1]
        tokens = generate(model, ids, cache, new, set()).tokens
    return tokens, logits, cache


def kept(cache: SnapevalCache) -> list[torch.Tensor]:
    """Every layer's held columns, per KV head, ascending (-1s first)."""
    return [layer.positions.sort(dim=-1).values for layer in cache.layers]


@pytest.mark.parametrize("method", METHODS)
def test_a_chunk_as_long_as_the_prompt_is_the_whole_prefill(llama, method):
    ids = prompt()
    whole_tokens, whole_logits, whole = answer(llama, ids, METHODS[method])
    tokens, logits, cache = answer(llama, ids, METHODS[method], chunk=LENGTH)
    assert tokens == whole_tokens
    assert torch.equal(logits, whole_logits)
    assert all(torch.equal(a, b) for a, b in zip(kept(cache), kept(whole), strict=True))


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3", "deepseek_v3"])
def test_the_full_cache_chunked_changes_nothing_but_numerics(family):
    """Mistral slides on every layer, Gemma 3 on some, DeepSeek-V3 caches MLA's latent."""
    model = model_of(family)
    ids = prompt()
    whole_tokens, whole_logits, whole = answer(model, ids, METHODS["full"], new=24)
    tokens, logits, cache = answer(model, ids, METHODS["full"], chunk=CHUNK, new=24)
    assert tokens == whole_tokens
    assert (logits - whole_logits).abs().max() < 1e-4
    assert all(torch.equal(a, b) for a, b in zip(kept(cache), kept(whole), strict=True))


def held_after_every_chunk(model, ids, node, monkeypatch) -> list[tuple[int, int]]:
    """(columns seen, most slots any KV head holds) of layer 0 after each of its selections."""
    found, keep_prompt = [], SnapevalCache.keep_prompt

    def recorded(self, layer, layer_prompt):
        keep_prompt(self, layer, layer_prompt)
        if layer is self.layers[0]:
            found.append((layer.seen, int((layer.positions >= 0).sum(dim=-1).max())))

    monkeypatch.setattr(SnapevalCache, "keep_prompt", recorded)
    with torch.inference_mode():
        prompt_logits(model, ids, build_cache(node))
    monkeypatch.undo()
    return found


@pytest.mark.parametrize("method", ["snapkv", "snapstream", "streaming_llm"])
def test_the_budget_holds_after_every_chunk_and_chunking_shows(llama, method, monkeypatch):
    node, ids = METHODS[method], prompt()
    held = held_after_every_chunk(llama, ids, chunked(node, CHUNK), monkeypatch)
    assert [seen for seen, _ in held] == [*range(CHUNK, LENGTH, CHUNK), LENGTH]
    assert all(slots <= node["budget"] for _, slots in held)
    assert held[-2][1] == node["budget"] - node.get("ring", 0)  # compressed before the last chunk
    whole_tokens, _, whole = answer(llama, ids, node)
    tokens, _, cache = answer(llama, ids, node, chunk=CHUNK)
    same_slots = all(torch.equal(a, b) for a, b in zip(kept(cache), kept(whole), strict=True))
    if method == "streaming_llm":  # sinks and the most recent tokens, whatever the chunks; what they
        assert same_slots and tokens != whole_tokens  # attended to while prefilling was not the prompt
    else:
        assert not same_slots


def test_a_ratio_is_a_share_of_the_whole_prompt(llama, monkeypatch):
    node = {"method": "snapkv", "budget": None, "ratio": 0.3, "window": 4, "kernel": 3}
    held = held_after_every_chunk(llama, prompt(), chunked(node, CHUNK), monkeypatch)
    assert len(held) == math.ceil(LENGTH / CHUNK)
    assert max(slots for _, slots in held) == held[-1][1] == math.ceil(0.3 * LENGTH)


def test_a_sliding_window_scores_by_the_held_slots_columns():
    """Slots at columns 0, 5, 60-63 on a layer sliding over 4: the last two queries (62, 63) see only
    60-63, where the slots' index alone would let query 62 (slot 4) see column 5 (slot 1)."""
    columns = torch.tensor([0, 5, 60, 61, 62, 63])
    generator = torch.Generator().manual_seed(0)
    query, keys = torch.randn(1, 2, 2, 8, generator=generator), torch.randn(1, 1, 6, 8, generator=generator)
    valid = torch.ones(1, 6, dtype=torch.bool)
    by_columns = window_attention(query, keys, valid, 2, 0.3, 4, columns.expand(1, 1, -1))
    by_index = window_attention(query, keys, valid, 2, 0.3, 4)
    assert (by_columns[..., :2] == 0).all() and (by_columns[..., 2:] > 0).all()
    assert (by_index[..., 1] > 0).all()


def layer_zero(model, ids) -> tuple[torch.Tensor, torch.Tensor]:
    """(heads, L, d) post-RoPE queries and (kv_heads, L, d) keys of layer 0, from its weights: layer 0
    reads the embeddings alone, so a chunk's are these whatever the cache held."""
    attention, inner = model.model.layers[0].self_attn, model.model
    with torch.no_grad():
        hidden = model.model.layers[0].input_layernorm(inner.embed_tokens(torch.tensor([ids])))
        cos, sin = inner.rotary_emb(hidden, torch.arange(len(ids))[None])
        shape = (1, len(ids), -1, attention.head_dim)
        query = attention.q_proj(hidden).view(shape).transpose(1, 2)
        key = attention.k_proj(hidden).view(shape).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
    return query[0], key[0]


def snapkv_by_hand(query, keys, columns, budget, window, kernel, scaling):
    """SnapKV's kept columns per KV head of a prompt whose slots hold ``keys`` (kv_heads, S, d) at
    ``columns`` (kv_heads, S), the last ``window`` queries ``query`` (heads, window, d) being the last
    slots' tokens: each query head's attention summed over the window and max-pooled over the slots before
    it, the mean over each GQA group, its best ``budget - window`` slots, and the window."""
    kv_heads, slots = columns.shape
    group, prefix = query.shape[0] // kv_heads, slots - window
    chosen = []
    for head in range(kv_heads):
        scores = torch.zeros(prefix)
        for q in query[head * group : (head + 1) * group]:
            summed = torch.zeros(slots)
            for i in range(window):
                logits = (q[i] @ keys[head].T) * scaling
                logits[prefix + i + 1 :] = float("-inf")
                summed += logits.softmax(-1)
            scores += torch.nn.functional.max_pool1d(summed[None, :prefix], kernel, 1, kernel // 2)[0] / group
        best = scores.topk(budget - window).indices.tolist()
        chosen.append(sorted(columns[head, [*best, *range(prefix, slots)]].tolist()))
    return chosen


def test_chunked_snapkv_keeps_a_plain_torch_selection_after_chunk_2(llama):
    ids, budget, window, kernel, chunk = prompt(24, seed=3), 10, 4, 3, 12
    node = {"method": "snapkv", "budget": budget, "window": window, "kernel": kernel}
    cache = build_cache(chunked(node, chunk))
    with torch.inference_mode():
        prompt_logits(llama, ids, cache)
    query, keys = layer_zero(llama, ids)
    scaling, heads = llama.model.layers[0].self_attn.scaling, keys.shape[0]
    first = torch.arange(chunk).expand(heads, -1)
    held = torch.tensor(snapkv_by_hand(query[:, 8:12], keys[:, :12], first, budget, window, kernel, scaling))
    held_keys = torch.stack([keys[head, held[head]] for head in range(heads)])
    both = torch.cat([held_keys, keys[:, 12:]], dim=1)
    columns = torch.cat([held, torch.arange(12, 24).expand(heads, -1)], dim=1)
    expected = snapkv_by_hand(query[:, 20:24], both, columns, budget, window, kernel, scaling)
    assert cache.kept_positions(0)[0].tolist() == expected
    whole = build_cache(node)
    with torch.inference_mode():
        prompt_logits(llama, ids, whole)
    assert whole.kept_positions(0)[0].tolist() != expected  # chunk 1's selection shows


def test_the_batcher_prefills_a_chunked_setting_alone_and_answers_as_one_by_one(llama):
    snapstream = chunked(METHODS["snapstream"], 32)
    ids = tuple(prompt(90, seed=5))
    requests = [
        Request(ids, node, 20, stop_ids=frozenset({7}), tag=n)
        for n, node in enumerate([snapstream, METHODS["snapstream"], snapstream])
    ]
    assert requests[0].prefill_key() != requests[1].prefill_key() == (ids, None, None)
    assert requests[0].prefill_key() == requests[2].prefill_key()
    got = {}
    ContinuousBatcher(llama, 2, "off").run(requests, lambda done: got.__setitem__(done.request.tag, done))
    for request in requests:
        with torch.inference_mode():
            alone = generate(llama, list(ids), build_cache(request.cache), 20, {7})
        assert got[request.tag].tokens == alone.tokens
    assert got[0].tokens != got[1].tokens


@pytest.mark.parametrize("method", ["speculative_prefill", "kvpress"])
def test_a_method_that_cannot_prefill_in_chunks_is_refused_in_one_line(method):
    with pytest.raises(SnapevalError, match="cannot prefill in chunks") as error:
        check_cache({"method": method, "budget": 64, "prefill_chunk": 256})
    assert error.value.field == "cache.prefill_chunk"


def test_a_grid_never_shares_a_chunked_prefill():
    with pytest.raises(SnapevalError, match="prefills in chunks"):
        CacheGrid([build_cache(METHODS["full"]), build_cache(chunked(METHODS["snapkv"], 32))])
