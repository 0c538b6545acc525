"""The fixed-shape slot cache and continuous batching against the plain one-by-one path.

All on a 2-layer random-weight Llama: equality of paths needs no trained weights.

* Every method at a fixed shape gives the growing cache's logits (fp32, < 1e-4), step by step.
* A mixed queue (prompt lengths, budgets, methods, greedy and sampled rows, rings that wrap, rows
  refilled several times) gives exactly the tokens of :func:`generate` run on each request alone.
* The compiled decode step runs hundreds of steps across refills and wrap-around from one graph, and
  no buffer of the slot cache ever moves.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from snapeval.cache import build_cache, install
from snapeval.cache.slots import SlotCache
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.continuous.classes import RowClasses
from snapeval.decode.generation import generate, prompt_logits
from snapeval.decode.sampling import Sampling
from tests.test_decode_eviction import TOY

TOLERANCE = 1e-4
SNAPSTREAM = {"method": "snapstream", "budget": 40, "window": 4, "kernel": 3, "sinks": 2, "ring": 16}
MIXED_METHODS = [
    {"method": "full"},
    SNAPSTREAM,
    {"method": "snapkv", "budget": 30, "window": 4, "kernel": 3, "pooling": "avg"},
    {"method": "streaming_llm", "budget": 24, "sinks": 2},
    {"method": "snapstream", "budget": 56, "window": 8, "kernel": 5, "sinks": 4, "ring": 12},
    {"method": "streaming_llm", "budget": 20, "sinks": 2, "rerotate": True},
    {"method": "sage_kv", "budget": 36, "sinks": 2, "recent": 12, "window": 2},
    {"method": "speculative_prefill", "budget": 40, "window": 4, "kernel": 3, "chunk": 8},
]
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    """A 2-layer Llama with random weights (GQA 4/2): fast to compile."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )
    return install(LlamaForCausalLM(config).eval())


def random_requests(count: int, max_new: int, seed: int = 1) -> list[Request]:
    generator = torch.Generator().manual_seed(seed)
    requests = []
    for index in range(count):
        length = int(torch.randint(20, 90, (1,), generator=generator))
        ids = tuple(torch.randint(0, 320, (length,), generator=generator).tolist())
        sampling = Sampling(
            do_sample=index % 2 == 1, temperature=0.9, top_p=0.9 if index % 4 == 1 else 1.0, seed=index
        )
        new = int(torch.randint(max_new // 4, max_new, (1,), generator=generator))
        cache = MIXED_METHODS[index % len(MIXED_METHODS)]
        requests.append(Request(ids, cache, new, sampling, frozenset({7}), tag=index))
    return requests


def answers(model, requests, rows, compile="off", refill=True, decode_attention="auto"):
    batcher = ContinuousBatcher(model, rows, compile, refill, decode_attention)
    got = {}
    batcher.run(requests, lambda answer: got.__setitem__(answer.request.tag, answer))
    return got, batcher


def alone(model, request: Request):
    return generate(
        model,
        list(request.prompt_ids),
        build_cache(request.cache),
        request.max_new_tokens,
        set(request.stop_ids),
        request.sampling,
        request.compress_at,
        followups=request.followups,
    )


@pytest.mark.parametrize("params", MIXED_METHODS, ids=lambda p: p["method"] + str(p.get("budget", "")))
def test_fixed_shape_rows_give_the_growing_caches_logits(tiny, params):
    """Teacher-forced decode: one slot row (in a batch of 2, wider than needed) == the plain cache."""
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 320, (90,), generator=generator).tolist()
    forced = torch.randint(0, 320, (40,), generator=generator).tolist()
    with torch.no_grad():
        plain, prefilled = build_cache(params), build_cache(params)
        prompt_logits(tiny, ids, plain)
        prompt_logits(tiny, ids, prefilled)
        slots = SlotCache.for_model(tiny, rows=2, capacity=len(ids) + 64)
        rows = RowClasses([slots])
        rows.load_row(1, prefilled, new_tokens=len(forced))
        for token in forced:
            expected = tiny(input_ids=torch.tensor([[token]]), past_key_values=plain).logits[0, -1]
            rows.begin_step()
            logits = tiny(
                input_ids=torch.tensor([[0], [token]]),
                position_ids=rows.seen[:, None],
                attention_mask=rows.model_mask,
                past_key_values=rows,
            ).logits[1, -1]
            rows.end_step()
            rows.check_step_attended()
            assert (logits - expected).abs().max() < TOLERANCE
    held, kept = slots.row_positions(1)[0], plain.kept_positions(0)[0]
    for head in range(held.shape[0]):  # the row holds exactly the tokens the plain cache holds
        assert sorted(held[head][held[head] >= 0].tolist()) == sorted(kept[head][kept[head] >= 0].tolist())
    if params["method"] != "full":
        held_prompt = (kept >= 0) & (kept < len(ids))
        assert held_prompt.sum(-1).max() < len(ids)  # the prompt was compressed


def test_continuous_batching_equals_one_by_one_on_a_mixed_queue(tiny):
    """4 prompts x 8 methods, greedy and sampled, 3 rows refilled many times."""
    generator = torch.Generator().manual_seed(4)
    prompts = [
        tuple(torch.randint(0, 320, (length,), generator=generator).tolist()) for length in (70, 25, 50, 90)
    ]
    requests = []
    for index in range(12):
        sampling = Sampling(do_sample=index % 3 == 1, temperature=0.8, top_p=0.95, seed=index)
        cache = MIXED_METHODS[index % len(MIXED_METHODS)]
        requests.append(
            Request(prompts[index % 4], cache, 20 + 4 * (index % 5), sampling, frozenset({7}), tag=index)
        )
    got, batcher = answers(tiny, requests, rows=3)
    for request in requests:
        reference = alone(tiny, request)
        assert got[request.tag].tokens == reference.tokens, request.cache
        assert got[request.tag].stopped == reference.stopped
    assert any(answer.ring_wraps > 0 for answer in got.values())
    assert batcher.steps < sum(len(answer.tokens) for answer in got.values()) / 2  # rows ran together


def test_refilled_rows_equal_static_batches_and_one_by_one(tiny):
    requests = random_requests(14, max_new=60)
    continuous, steps_continuous = answers(tiny, requests, rows=4)
    static, steps_static = answers(tiny, requests, rows=4, refill=False)
    for request in requests:
        reference = alone(tiny, request).tokens
        assert continuous[request.tag].tokens == static[request.tag].tokens == reference
    assert steps_continuous.steps < steps_static.steps  # refilling never waits for the longest row


def test_split_kv_decode_attention_rows_equal_one_by_one(tiny):
    """``run.decode_attention=split`` (a GPU's default, chosen here on CPU): every method's rows, refilled,
    give the one-by-one tokens, and every decode call of the step went through the split attention."""
    from snapeval.cache import attention

    requests, calls = random_requests(12, max_new=40, seed=9), []
    original = attention.split_decode_attention

    def counted(*args):
        calls.append(args[0].shape[0])
        return original(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "split_decode_attention", counted)
        got, batcher = answers(tiny, requests, rows=3, decode_attention="split")
    assert len(calls) >= batcher.steps * tiny.config.num_hidden_layers
    for request in requests:
        assert got[request.tag].tokens == alone(tiny, request).tokens, request.cache


def test_draws_of_one_prompt_share_one_prefill_and_split_its_seconds(tiny):
    ids = tuple(range(5, 60))
    draws = [Request(ids, SNAPSTREAM, 30, Sampling(True, 1.0, 1.0, seed), tag=seed) for seed in range(4)]
    got, _ = answers(tiny, draws, rows=2)
    assert len({tuple(answer.tokens) for answer in got.values()}) == 4
    assert len({answer.prefill_s for answer in got.values()}) == 1  # one prefill, split four ways
    for request in draws:
        assert got[request.tag].tokens == alone(tiny, request).tokens


def test_compiled_step_runs_hundreds_of_steps_with_refills_from_one_graph(tiny):
    """fullgraph, dynamic=False: >= 200 steps, 24 requests through 3 rows, rings wrapping, rows
    re-selected while decoding (tests/test_decode_eviction.py's toy method, both rules), no recompile;
    the answers are the one-by-one answers and no buffer moves."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    requests = random_requests(24, max_new=80, seed=3)
    rules = [{"budget": 92, "buffer": 12}, {"budget": 90, "buffer": 10, "every": 5}]
    toys = [{"method": TOY, **rule} for rule in rules]
    requests = [replace(r, cache=toys[n % 2]) if n % 4 == 3 else r for n, r in enumerate(requests)]
    batcher = ContinuousBatcher(tiny, 3, compile="on")
    pointers, got = [], {}

    def on_answer(answer):
        pointers.append([tensor.data_ptr() for tensor in batcher.slots.tensors()])
        got[answer.request.tag] = answer

    with torch._dynamo.config.patch(error_on_recompile=True):
        batcher.run(requests, on_answer)
    assert batcher.steps >= 200
    assert counters["stats"]["unique_graphs"] == 1
    assert len(pointers) == 24 and all(p == pointers[0] for p in pointers)
    assert any(answer.ring_wraps > 1 for answer in got.values())
    assert sum(len(answer.evictions) for answer in got.values()) >= 10
    for request in requests:
        assert got[request.tag].tokens == alone(tiny, request).tokens


def test_follow_up_requests_are_answered_and_kv_bytes_are_the_rows_own(tiny):
    first = Request(tuple(range(3, 50)), {"method": "full"}, 10, tag="first")
    seen = []

    def on_answer(answer):
        seen.append(answer)
        if answer.request.tag == "first":
            return [Request(tuple(range(3, 20)), {"method": "full"}, 10, tag="second")]
        return []

    ContinuousBatcher(tiny, 2).run([first], on_answer)
    assert [a.request.tag for a in seen] == ["first", "second"]
    slot_bytes = 2 * 2 * 2 * 16 * 4  # layers x (keys, values) x kv_heads x head_dim x float32
    assert seen[0].kv_bytes == (47 + len(seen[0].tokens) - 1) * slot_bytes


def test_a_follow_up_longer_than_any_first_request_grows_the_rows(tiny):
    """A second pass that needs more slots than were reserved: the rows grow, nothing is lost."""
    first = [Request(tuple(range(3, 20)), {"method": "full"}, 6, tag=f"short{i}") for i in range(3)]
    longer = Request(tuple(range(3, 120)), {"method": "full"}, 30, tag="long")
    got = {}

    def on_answer(answer):
        got[answer.request.tag] = answer
        return [longer] if answer.request.tag == "short0" else []

    batcher = ContinuousBatcher(tiny, 2)
    batcher.run(first, on_answer)
    assert batcher.slots.capacity == 117 + 30
    for request in [*first, longer]:
        assert got[request.tag].tokens == alone(tiny, request).tokens


def test_auto_splits_on_a_gpu_only_where_the_rows_leave_multiprocessors_idle(monkeypatch):
    from types import SimpleNamespace

    from snapeval.decode.continuous.compiled import splits_decode
    from snapeval.errors import SnapevalError

    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132)
    )
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert splits_decode("auto", cuda, 1 * 8) and not splits_decode("auto", cuda, 32 * 8)
    assert not splits_decode("auto", cpu, 1 * 8)
    assert splits_decode("split", cpu, 32 * 8) and not splits_decode("grouped", cuda, 1 * 8)
    with pytest.raises(SnapevalError, match="run.decode_attention: choose one of auto, grouped, split"):
        splits_decode("flash", cuda, 8)
