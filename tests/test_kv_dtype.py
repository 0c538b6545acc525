"""``cache.kv_dtype=fp8_e4m3``: keys and values stored as ``torch.float8_e4m3fn``, a per-tensor scale of
1.0, saturated to +-448, read back in the model's dtype (docs/protocols.md, "FP8 KV").

* Storing saturates to +-448 (torch's own cast does only from torch 2.12 on; before, NaN beyond 464).
* A decode step's attention over FP8 rows is a float64 attention over the keys and values
  quantize-dequantized (``x.clamp(-448, 448).to(float8_e4m3fn).to(float64)``), to 1e-6.
* On a 2-layer random Llama (fp32), the batcher's FP8 rows give the single-sequence FP8 cache's tokens
  (full, SnapStream, StreamingLLM re-rotated; greedy and sampled), and a row's logits equal the single
  cache's while both differ from the fp32 cache's: the dtype is applied on both paths.
* The batcher's memory check, the answer's ``kv_bytes``, ``KVLayer.kv_bytes`` and the memory estimator
  count one FP8 row alike, 1 byte an element: a half of bf16's, a quarter of fp32's.
* A request of another ``cache.kv_dtype`` than its batcher's rows is refused in one line; a run builds a
  batcher per ``cache.kv_dtype``, the model's dtype first.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from snapeval.cache import build_cache, install
from snapeval.cache.attention import cache_keyword
from snapeval.cache.decode_attention import grouped_decode_attention, split_decode_attention
from snapeval.cache.layer import to_storage
from snapeval.cache.slots import SlotCache, cached_shapes
from snapeval.decode import batch_rows
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.continuous.classes import RowClasses
from snapeval.decode.generation import generate, prompt_logits
from snapeval.decode.sampling import Sampling
from snapeval.errors import SnapevalError
from snapeval.memory import estimate, load_geometry
from snapeval.run.evaluation import by_kv_dtype

FP8 = "fp8_e4m3"
VOCAB, LAYERS, KV_HEADS, HEAD_DIM = 320, 2, 2, 16
SLOT_FP8 = LAYERS * KV_HEADS * (HEAD_DIM + HEAD_DIM) * 1  # bytes a token holds over layers: 128
METHODS = [
    {"method": "full"},
    {"method": "snapstream", "budget": 40, "window": 4, "kernel": 3, "sinks": 2, "ring": 16},
    {"method": "streaming_llm", "budget": 24, "sinks": 2, "rerotate": True},
]

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def tiny_llama(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A 2-layer random Llama, GQA 4/2 of 16 dimensions, in ``dtype``."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=1024,
        eos_token_id=None,
    )
    model = LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = None
    return install(model)


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return tiny_llama()


def fp8(params: dict) -> dict:
    return {**params, "kv_dtype": FP8}


def reference(x: torch.Tensor) -> torch.Tensor:
    """``x`` stored in FP8 and read back, in float64: the reference every FP8 read is held to."""
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.float64)


def test_storing_saturates_to_the_largest_finite_fp8():
    x = torch.tensor([1000.0, -float("inf"), 448.0, 0.3, -2.7])
    stored = to_storage(x, torch.float8_e4m3fn)
    assert stored.dtype == torch.float8_e4m3fn
    assert stored.float().tolist() == [448.0, -448.0, 448.0, 0.3125, -2.75]
    assert to_storage(x, torch.float32) is x  # the model's own dtype: as it is


@pytest.mark.parametrize("attention", [grouped_decode_attention, split_decode_attention])
def test_decode_attention_over_fp8_rows_is_float64_attention_over_dequantized_slots(attention):
    rows, heads, slots, held = 3, 4, 24, [24, 9, 1]
    generator = torch.Generator().manual_seed(3)
    keys = 3 * torch.randn(slots, rows, KV_HEADS, 1, HEAD_DIM, generator=generator)
    values = torch.randn(slots, rows, KV_HEADS, 1, HEAD_DIM, generator=generator)
    values[::5, :, :, :, ::3] = 1000.0  # saturates
    cache = SlotCache(
        rows, slots, 1, KV_HEADS, HEAD_DIM, HEAD_DIM, torch.float32, torch.device("cpu"), kv_dtype=FP8
    )
    rings = cache.rings[None]
    rings.size.copy_(torch.tensor(held))  # each row a ring of its own slots, filled one step at a time
    for step in range(slots):
        cache.begin_step()
        cache.write(keys[step], values[step], 0)
        cache.end_step()
    assert cache.keys[0].dtype == cache.values[0].dtype == torch.float8_e4m3fn
    query = torch.randn(rows, heads, 1, HEAD_DIM, generator=generator)
    mask = cache.attention_mask(0, heads)
    out = attention(query, cache.keys_to_attend(0), cache.values_to_attend(0), mask, HEAD_DIM**-0.5)
    for row, count in enumerate(held):
        last = range(slots - count, slots)  # a ring of `count` slots holds the last `count` steps
        order = [step % count for step in last]
        k = torch.empty(count, KV_HEADS, HEAD_DIM, dtype=torch.float64)
        v = torch.empty_like(k)
        k[order] = reference(keys[list(last), row, :, 0])
        v[order] = reference(values[list(last), row, :, 0])
        q = query[row, :, 0].double().view(KV_HEADS, heads // KV_HEADS, HEAD_DIM)
        weights = torch.softmax(torch.einsum("hgd,shd->hgs", q, k) * HEAD_DIM**-0.5, dim=-1)
        expected = torch.einsum("hgs,shd->hgd", weights, v).reshape(heads, HEAD_DIM)
        error = (out[row, 0].double() - expected).abs().max() / expected.abs().max()
        assert error < 1e-6, (row, float(error))
    assert out.abs().max() > 100  # the saturated values are attended


@pytest.mark.parametrize("params", METHODS, ids=lambda params: params["method"])
def test_the_batcher_s_fp8_rows_give_the_single_fp8_cache_s_tokens(llama, params):
    generator = torch.Generator().manual_seed(5)
    prompts = [tuple(torch.randint(3, VOCAB, (length,), generator=generator).tolist()) for length in (60, 45)]
    requests = [
        Request(prompt, fp8(params), 20, Sampling(do_sample=sampled, temperature=0.9, seed=7), tag=index)
        for index, (prompt, sampled) in enumerate((p, s) for p in prompts for s in (False, True))
    ]
    got = {}
    ContinuousBatcher(llama, 3, kv_dtype=FP8).run(
        requests, lambda answer: got.__setitem__(answer.request.tag, answer)
    )
    for request in requests:
        cache = build_cache(request.cache)
        alone = generate(llama, list(request.prompt_ids), cache, 20, set(), request.sampling)
        assert got[request.tag].tokens == alone.tokens
        assert cache.layers[0].keys.dtype == torch.float8_e4m3fn


def test_a_row_s_fp8_logits_are_the_single_cache_s_and_not_the_fp32_cache_s(llama):
    params = METHODS[1]
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (70,), generator=generator).tolist()
    forced = torch.randint(3, VOCAB, (24,), generator=generator).tolist()
    plain, single, prefilled = build_cache(params), build_cache(fp8(params)), build_cache(fp8(params))
    keyword = cache_keyword(llama)
    with torch.no_grad():
        appended = [
            prompt_logits(llama, ids, cache, compress_at=60)[-1] for cache in (plain, single, prefilled)
        ]
        assert (appended[1] - appended[0]).abs().max() > 1e-4  # the appended query reads FP8 slots
        rows = RowClasses([SlotCache.for_model(llama, 2, 64, cached_shapes(llama)._replace(kv_dtype=FP8))])
        rows.load_row(1, prefilled, new_tokens=len(forced))
        differ = 0.0
        for token in forced:
            step = torch.tensor([[token]])
            expected = llama(input_ids=step, **{keyword: single}).logits[0, -1]
            model_dtype = llama(input_ids=step, **{keyword: plain}).logits[0, -1]
            rows.begin_step()
            logits = llama(
                input_ids=torch.tensor([[0], [token]]),
                position_ids=rows.seen[:, None],
                attention_mask=rows.model_mask,
                **{keyword: rows},
            ).logits[1, -1]
            rows.end_step()
            assert (logits - expected).abs().max() < 1e-5
            differ = max(differ, float((expected - model_dtype).abs().max()))
    assert differ > 1e-3


@pytest.mark.parametrize(("dtype", "times"), [(torch.float32, 4), (torch.bfloat16, 2)])
def test_the_check_the_answer_the_layer_and_the_estimator_count_an_fp8_row_alike(
    dtype, times, monkeypatch, tmp_path
):
    model = tiny_llama(dtype)
    prompt, new = tuple(range(3, 43)), 8
    held = len(prompt) + new - 1  # the last token drawn is never fed
    request = Request(prompt, fp8({"method": "full"}), new)
    assert request.slots_needed == 48
    shapes = cached_shapes(model)._replace(kv_dtype=FP8)
    row = 48 * SLOT_FP8 + 48 * LAYERS * KV_HEADS * 8 + 48  # keys and values, positions, valid flags
    assert shapes.kv_bytes(48) == 6144 and batch_rows.row_bytes(48, shapes) == row == 7728
    free = {"bytes": row - 1}
    monkeypatch.setattr(batch_rows, "free_bytes", lambda device: free["bytes"])
    batcher = ContinuousBatcher(model, 1, kv_dtype=FP8)
    with pytest.raises(SnapevalError, match="^run.batch_size: 1 rows of 48 slots take "):
        batcher.reserve([request])
    free["bytes"] = row
    answers = []
    batcher.run([request], answers.append)  # fits to the byte
    cache = build_cache(request.cache)
    generate(model, list(prompt), cache, new, set())
    model.config.save_pretrained(tmp_path)
    estimated = estimate(load_geometry(str(tmp_path)), "h100", context=held, kv_dtype=FP8)
    assert answers[0].kv_bytes == cache.kv_bytes() == estimated.kv_bytes_per_sequence_full == held * SLOT_FP8
    model_dtype = build_cache({"method": "full"})
    generate(model, list(prompt), model_dtype, new, set())
    assert model_dtype.kv_bytes() == times * held * SLOT_FP8


def test_a_request_of_another_kv_dtype_is_refused_in_one_line(llama):
    request = Request(tuple(range(3, 23)), fp8({"method": "full"}), 4)
    with pytest.raises(SnapevalError) as refused:
        ContinuousBatcher(llama, 1).run([request], lambda answer: None)
    assert str(refused.value) == (
        "cache.kv_dtype: a request stores fp8_e4m3, these rows the model's dtype: a batcher each"
    )
    other = Request(tuple(range(3, 23)), {"method": "full"}, 4)
    with pytest.raises(
        SnapevalError, match="^cache.kv_dtype: a request stores the model's dtype, these rows fp8"
    ):
        ContinuousBatcher(llama, 1, kv_dtype=FP8).run([other], lambda answer: None)


def test_a_run_builds_a_batcher_per_kv_dtype_the_model_s_first():
    a, b, c = (SimpleNamespace(setting=SimpleNamespace(kv_dtype=kv)) for kv in (FP8, None, FP8))  # points
    assert list(by_kv_dtype([[a, b, c]]).items()) == [(None, [[b]]), (FP8, [[a, c]])]  # a grid
    assert list(by_kv_dtype([[a], [b], [c]]).items()) == [(None, [[b]]), (FP8, [[a], [c]])]  # one by one
