"""Engine behaviour users rely on: fixed shapes, the ring, padding, memory accounting, bad parameters."""

from __future__ import annotations

import pytest
import torch

from snapeval.cache import FullCache, SnapKVCache, SnapStreamCache, StreamingLLMCache, build_cache
from snapeval.configs.setting import check_cache
from snapeval.errors import SnapevalError
from snapeval.models import encode_chat

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUESTION = "List three facts about the Moon, then three facts about Mars, in full sentences."


def decode(model, prompt_ids, cache, steps):
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt_ids]), past_key_values=cache).logits[0, -1]
        for _ in range(steps):
            token = torch.tensor([[int(logits.argmax())]])
            logits = model(input_ids=token, past_key_values=cache).logits[0, -1]
            yield cache


def test_snapstream_buffers_never_move_or_resize_past_capacity(tiny_llama_chat):
    prompt_ids = encode_chat(tiny_llama_chat.tokenizer, [{"role": "user", "content": QUESTION}])
    cache = SnapStreamCache(budget=24, window=4, kernel=3, sinks=2, ring=8)
    steps = iter(decode(tiny_llama_chat.model, prompt_ids, cache, steps=60))
    next(steps)
    layouts = [(layer.keys.shape, layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    for _ in steps:
        assert [
            (lay.keys.shape, lay.keys.data_ptr(), lay.values.data_ptr()) for lay in cache.layers
        ] == layouts
    assert layouts[0][0] == (1, 2, 24, 16)
    assert cache.layers[0].seen == len(prompt_ids) + 60 > 24 + 50


def test_ring_overwrites_exactly_the_oldest_generated_slot(tiny_llama_chat):
    prompt_ids = encode_chat(tiny_llama_chat.tokenizer, [{"role": "user", "content": QUESTION}])
    length, pinned, ring = len(prompt_ids), 16, 8
    cache = SnapStreamCache(budget=pinned + ring, window=4, kernel=3, sinks=2, ring=ring)
    for step, _ in enumerate(decode(tiny_llama_chat.model, prompt_ids, cache, steps=20), start=1):
        positions = cache.kept_positions(1)[0, 0]
        generated = positions[pinned:].tolist()
        newest = length + step - 1  # column of the token just fed
        expected = {c for c in range(max(length, newest - ring + 1), newest + 1)}
        assert {c for c in generated if c >= 0} == expected
        assert (positions[:pinned] < length).all()  # the pinned prompt never moves


def test_streaming_llm_keeps_sinks_and_most_recent_prompt_tokens(tiny_llama_chat):
    prompt_ids = encode_chat(tiny_llama_chat.tokenizer, [{"role": "user", "content": QUESTION}])
    cache = StreamingLLMCache(budget=20, sinks=4)
    with torch.inference_mode():
        tiny_llama_chat.model(input_ids=torch.tensor([prompt_ids]), past_key_values=cache)
    length = len(prompt_ids)
    assert cache.kept_positions(0)[0, 1].tolist() == [0, 1, 2, 3, *range(length - 16, length)]


def test_left_padded_batch_matches_each_prompt_alone_and_never_keeps_padding(tiny_llama_chat):
    tokenizer, model = tiny_llama_chat.tokenizer, tiny_llama_chat.model
    prompts = [QUESTION, "Name a colour."]
    encoded = [encode_chat(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    width = max(map(len, encoded))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(e)) + e for e in encoded])
    attention_mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])

    def make():
        return SnapStreamCache(budget=40, window=4, kernel=3, sinks=2, ring=8)

    batched_cache = make()
    batched = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        past_key_values=batched_cache,
        max_new_tokens=12,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    pad = width - len(encoded[1])
    kept = batched_cache.kept_positions(1)[1]
    assert not ((kept >= 0) & (kept < pad)).any()  # padding columns are never kept
    for row, ids in enumerate(encoded):
        alone = model.generate(
            input_ids=torch.tensor([ids]),
            past_key_values=make(),
            max_new_tokens=12,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        steps = len(alone.logits)
        batched_logits = torch.stack(batched.logits)[:steps, row]
        assert (batched_logits - torch.stack(alone.logits)[:, 0]).abs().max().item() < 1e-4


def test_kv_bytes_is_budget_times_layers_heads_dim_two_dtype(tiny_llama_chat):
    prompt_ids = encode_chat(tiny_llama_chat.tokenizer, [{"role": "user", "content": QUESTION}])
    cache = SnapStreamCache(budget=32, window=4, kernel=3, sinks=2, ring=8)
    full = build_cache({"method": "full"})
    with torch.inference_mode():
        tiny_llama_chat.model(input_ids=torch.tensor([prompt_ids]), past_key_values=cache)
        tiny_llama_chat.model(input_ids=torch.tensor([prompt_ids]), past_key_values=full)
    assert cache.kv_bytes() == 32 * 2 * 2 * 16 * 2 * 4  # budget x layers x KV heads x head dim x K,V x fp32
    assert full.kv_bytes() == len(prompt_ids) * 2 * 2 * 16 * 2 * 4


def test_ratio_sizes_the_cache_from_the_prompt(tiny_llama_chat):
    prompt_ids = encode_chat(tiny_llama_chat.tokenizer, [{"role": "user", "content": QUESTION}])
    cache = build_cache({"method": "snapkv", "budget": None, "ratio": 0.5, "window": 4})
    with torch.inference_mode():
        tiny_llama_chat.model(input_ids=torch.tensor([prompt_ids]), past_key_values=cache)
    assert cache.kept_positions(0).shape[-1] == -(-len(prompt_ids) // 2)


@pytest.mark.parametrize(
    "params,field",
    [
        ({"method": "snapstream", "budget": 100, "window": 32, "sinks": 4, "ring": 64}, "cache.budget"),
        ({"method": "snapkv", "budget": 32, "window": 32}, "cache.budget"),
        ({"method": "snapkv", "budget": 256, "window": 0}, "cache.window"),
        ({"method": "snapkv", "budget": 256, "kernel": 4}, "cache.kernel"),
        ({"method": "snapkv", "budget": 256, "kernel": -3}, "cache.kernel"),
        ({"method": "snapstream", "budget": 256, "pooling": "median"}, "cache.pooling"),
        ({"method": "snapstream", "budget": 256, "gqa_reduce": "sum"}, "cache.gqa_reduce"),
        ({"method": "streaming_llm", "budget": 4, "sinks": 4}, "cache.budget"),
        ({"method": "snapkv", "budget": 256, "ratio": 0.5}, "cache.budget"),
        ({"method": "snapkv", "budget": None, "ratio": 1.5}, "cache.ratio"),
        ({"method": "sage_kv", "budget": 68, "sinks": 4, "recent": 64}, "cache.budget"),
        ({"method": "sage_kv", "budget": 256, "recent": 0}, "cache.recent"),
        ({"method": "sage_kv", "budget": 256, "window": 0}, "cache.window"),
        ({"method": "h2o", "budget": 256}, "cache.method"),
        ({"method": "no_such_module:Cache", "budget": 256}, "cache.method"),
        ({"method": "snapeval.errors:SnapevalError"}, "cache.method"),
        ({"method": "snapkv", "budget": 256, "windw": 8}, "cache.windw"),
    ],
)
def test_bad_parameters_fail_with_the_field_named(params, field):
    with pytest.raises(SnapevalError) as error:
        build_cache(params)
    assert error.value.field == field
    if ":" not in params["method"]:  # a built-in method's config is refused alike, before torch is needed
        with pytest.raises(SnapevalError) as error:
            check_cache(params)
        assert error.value.field == field


def test_a_cache_takes_its_method_s_parameters_as_keywords():
    assert SnapStreamCache(budget=256).params() == {
        "method": "snapstream",
        "budget": 256,
        "ratio": None,
        "window": 32,
        "kernel": 7,
        "pooling": "max",
        "sinks": 4,
        "ring": 64,
        "gqa_reduce": "mean",
    }
    by_ratio = SnapKVCache(ratio=0.25, window=4)  # a ratio stands instead of the default budget
    assert (by_ratio.budget, by_ratio.decode_slots(400, 10)) == (None, 110)
    assert build_cache({"method": "full", "budget": 64}, strict=False).params() == {"method": "full"}
    with pytest.raises(
        SnapevalError, match="full takes no parameter budget; it takes prefill_chunk, kv_dtype$"
    ):
        build_cache({"method": "full", "budget": 64})
    with pytest.raises(TypeError, match="FullCache takes no parameter budget"):
        FullCache(budget=64)


def test_kept_histogram_is_the_share_of_each_prompt_region_still_held():
    from snapeval.cache.base import KVLayer

    cache = StreamingLLMCache(budget=20, sinks=4)
    layer = KVLayer()
    layer.positions = torch.tensor(
        [[[0, 1, 2, 3, *range(84, 100), 100, -1]]]
    )  # sinks, recent, a generated, empty
    cache.layers.append(layer)
    histogram = cache.kept_histogram(prompt_length=100, bins=10)
    assert histogram["counts"] == pytest.approx([0.4, 0, 0, 0, 0, 0, 0, 0, 0.6, 1.0])
    assert histogram["bins"] == pytest.approx([i / 10 for i in range(11)])
