"""The decode step's grouped and split attention (snapeval/cache/decode_attention.py) against a naive
float64 reference: random held-slot layouts (a mask per row, or per query head as a sliding window's), GQA
groups of 1, 4 and 8, value widths apart from the key's (MLA); and a row's output does not depend on the
others. The split attention runs with chunks of 8 slots, so several chunks, a shorter last one and a
chunk that sees no slot occur."""

from __future__ import annotations

import math

import pytest
import torch

from snapeval.cache.decode_attention import grouped_decode_attention, split_decode_attention

ROWS, SLOTS, DIM = 3, 40, 16


def naive(query, key, value, mask, scaling):
    """Per row and query head, a softmax over the slots it may see, in float64."""
    rows, heads = query.shape[:2]
    group = heads // key.shape[1]
    output = torch.zeros(rows, 1, heads, value.shape[-1], dtype=torch.float64)
    for row in range(rows):
        for head in range(heads):
            keys, values = key[row, head // group].double(), value[row, head // group].double()
            scores = keys @ query[row, head, 0].double() * scaling
            if mask is not None:
                visible = mask[row, head if mask.shape[1] > 1 else 0, 0]
                scores = scores.masked_fill(~visible, -math.inf)
            output[row, 0, head] = torch.softmax(scores, dim=0) @ values
    return output


def inputs(kv_heads: int, group: int, value_dim: int, per_head: bool, seed: int = 0, slots: int = SLOTS):
    generator = torch.Generator().manual_seed(seed)
    heads = kv_heads * group
    query = torch.randn(ROWS, heads, 1, DIM, generator=generator)
    key = torch.randn(ROWS, kv_heads, slots, DIM, generator=generator)
    value = torch.randn(ROWS, kv_heads, slots, value_dim, generator=generator)
    mask = torch.rand(ROWS, heads if per_head else 1, 1, slots, generator=generator) < 0.6
    mask[..., 0] = True  # every query head sees at least one slot
    return query, key, value, mask


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("per_head", [False, True], ids=["row mask", "per-head (window) mask"])
@pytest.mark.parametrize("value_dim", [DIM, 12], ids=["values as keys", "narrower values (MLA)"])
def test_grouped_decode_attention_equals_a_naive_reference(group, per_head, value_dim):
    query, key, value, mask = inputs(2, group, value_dim, per_head)
    output = grouped_decode_attention(query, key, value, mask, 0.25)
    assert output.shape == (ROWS, 1, 2 * group, value_dim)
    torch.testing.assert_close(output.double(), naive(query, key, value, mask, 0.25), atol=1e-5, rtol=1e-5)


def test_no_mask_attends_to_every_slot():
    query, key, value, _ = inputs(2, 4, DIM, False)
    output = grouped_decode_attention(query, key, value, None, DIM**-0.5)
    expected = naive(query, key, value, None, DIM**-0.5)
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


def test_a_rows_output_is_the_same_bits_whatever_the_other_rows_hold():
    query, key, value, mask = inputs(2, 4, DIM, True)
    other = inputs(2, 4, DIM, True, seed=1)
    changed = [tensor.clone() for tensor in (query, key, value, mask)]
    for tensor, replacement in zip(changed, other, strict=True):
        tensor[1:] = replacement[1:]  # rows 1 and 2 hold something else
    first = grouped_decode_attention(query, key, value, mask, 0.25)
    again = grouped_decode_attention(*changed, 0.25)
    assert torch.equal(first[0], again[0])
    assert torch.equal(first, grouped_decode_attention(query, key, value, mask, 0.25))  # and on re-run


def test_every_decode_step_of_the_batcher_goes_through_it(tiny_llama, monkeypatch):
    from snapeval.cache import attention
    from snapeval.decode.continuous import ContinuousBatcher, Request

    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        return grouped_decode_attention(*args)

    monkeypatch.setattr(attention, "grouped_decode_attention", counted)
    requests = [Request(tuple(range(3, 43)), {"method": "full"}, 5, tag=i) for i in range(2)]
    ContinuousBatcher(tiny_llama, rows=2).run(requests, lambda answer: None)
    layers = tiny_llama.config.num_hidden_layers
    assert len(calls) == 4 * layers  # the first token comes from prefill, then 4 steps
    assert all(shape == (2, tiny_llama.config.num_attention_heads, 1, 16) for shape in calls)


@pytest.mark.parametrize("split", [False, True], ids=["one softmax", "split-KV chunks"])
@pytest.mark.parametrize("per_head", [False, True], ids=["row mask", "per-head mask"])
def test_absorbed_mla_decode_equals_attention_over_the_expanded_keys_and_values(per_head, split):
    """MLA at decode: attention in latent space (queries absorbed through the key half of kv_b_proj, the
    output projected through the value half) equals attention over the per-head keys and values the
    model's own expand_kv makes of the same held latent slots (DeepSeek-V3 geometry, float32)."""
    from snapeval.cache import attention, install
    from snapeval.cache.mla import absorbed_decode_attention
    from tests.families import FAMILIES

    model = install(FAMILIES["deepseek_v3"](512))
    module = next(m for m in model.modules() if attention.EXPAND_LATENT in vars(m))
    generator = torch.Generator().manual_seed(0)
    heads, rank, rope = module.config.num_attention_heads, module.kv_lora_rank, module.qk_rope_head_dim
    query = torch.randn(ROWS, heads, 1, module.qk_nope_head_dim + rope, generator=generator)
    latent = torch.randn(ROWS, 1, SLOTS, rank, generator=generator)
    rotary = torch.randn(ROWS, 1, SLOTS, rope, generator=generator)
    mask = torch.rand(ROWS, heads if per_head else 1, 1, SLOTS, generator=generator) < 0.6
    mask[..., 0] = True
    projections = vars(module)[attention.UP_PROJECTIONS]
    chunk = 6 if split else None  # 6 chunks, and a shorter last one
    absorbed = absorbed_decode_attention(query, latent, rotary, mask, module.scaling, projections, chunk)
    keys, values = vars(module)[attention.EXPAND_LATENT](latent, rotary)  # the model's own expansion
    expanded = naive(query, keys, values, mask, module.scaling)
    assert absorbed.shape == (ROWS, 1, heads, module.v_head_dim)
    torch.testing.assert_close(absorbed.double(), expanded, atol=1e-5, rtol=1e-5)


def test_an_mla_decode_step_never_expands_the_held_latent(monkeypatch):
    """The batcher's MLA steps attend in latent space: the model's expand_kv runs at prefill only."""
    from snapeval.cache import attention, install
    from snapeval.decode.continuous import ContinuousBatcher, Request
    from tests.families import FAMILIES

    model = install(FAMILIES["deepseek_v3"](512))
    model.generation_config.eos_token_id = None
    expanded = []
    for module in model.modules():
        if attention.EXPAND_LATENT in vars(module):
            own = vars(module)[attention.EXPAND_LATENT]
            monkeypatch.setitem(
                vars(module),
                attention.EXPAND_LATENT,
                lambda c, r, own=own: expanded.append(c.shape) or own(c, r),
            )
    requests = [
        Request(tuple(range(3, 43)), {"method": "snapstream", "budget": 36, "window": 8, "ring": 8}, 6)
    ]
    ContinuousBatcher(model, rows=2).run(requests, lambda answer: None)
    # the batcher's one-token probe of what the model caches, then the 40-token prefill; no held slots
    assert {shape[2] for shape in expanded} == {1, 40}


def test_split_kv_mla_rows_equal_the_one_by_one_decode(monkeypatch):
    """``run.decode_attention=split`` on MLA: the batcher's latent-space attention over chunks (of 8 slots
    here, so that rows span several) gives the one-by-one tokens."""
    from snapeval.cache import attention, build_cache, install, mla
    from snapeval.decode.continuous import ContinuousBatcher, Request
    from snapeval.decode.generation import generate
    from tests.families import FAMILIES

    monkeypatch.setattr(attention, "SPLIT_CHUNK", 8)
    chunked, original = [], mla.chunked_attention
    monkeypatch.setattr(mla, "chunked_attention", lambda *args: chunked.append(args[2]) or original(*args))
    model = install(FAMILIES["deepseek_v3"](512))
    model.generation_config.eos_token_id = None
    caches = [{"method": "full"}, {"method": "snapstream", "budget": 36, "window": 8, "ring": 8}]
    requests = [Request(tuple(range(3, 43 + 9 * n)), caches[n % 2], 8, tag=n) for n in range(4)]
    got = {}
    ContinuousBatcher(model, 2, decode_attention="split").run(
        requests, lambda answer: got.__setitem__(answer.request.tag, answer.tokens)
    )
    for request in requests:
        alone = generate(model, list(request.prompt_ids), build_cache(caches[request.tag % 2]), 8, set())
        assert got[request.tag] == alone.tokens
    assert chunked and set(chunked) == {8}  # every decode step's attention went through the chunks


CHUNK = 8
LAYOUTS = {"GQA": (2, DIM), "MLA-like": (1, 12)}  # KV heads, value width


def split_inputs(layout: str, group: int, per_head: bool, slots: int, seed: int = 0):
    """:func:`inputs` with slots 8 to 15 (the second chunk of 8) hidden from every query head."""
    kv_heads, value_dim = LAYOUTS[layout]
    query, key, value, mask = inputs(kv_heads, group, value_dim, per_head, seed, slots)
    mask[..., CHUNK : 2 * CHUNK] = False
    return query, key, value, mask


@pytest.mark.parametrize("slots", [5, 40, 45], ids=["one short chunk", "5 chunks", "5 chunks and 5"])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("per_head", [False, True], ids=["row mask", "per-head (window) mask"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_split_decode_attention_equals_the_naive_reference_and_grouped(layout, group, per_head, slots):
    query, key, value, mask = split_inputs(layout, group, per_head, slots)
    output = split_decode_attention(query, key, value, mask, 0.25, chunk=CHUNK)
    assert output.shape == (ROWS, 1, key.shape[1] * group, value.shape[-1])
    assert output.dtype == query.dtype
    torch.testing.assert_close(output.double(), naive(query, key, value, mask, 0.25), atol=1e-5, rtol=1e-5)
    grouped = grouped_decode_attention(query, key, value, mask, 0.25)
    torch.testing.assert_close(output, grouped, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_split_with_no_mask_attends_to_every_slot(layout):
    query, key, value, _ = split_inputs(layout, 4, False, 45)
    output = split_decode_attention(query, key, value, None, DIM**-0.5, chunk=CHUNK)
    expected = naive(query, key, value, None, DIM**-0.5)
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


def test_split_hidden_slots_contribute_nothing_whatever_they_hold():
    """The chunk that sees no slot, and every hidden slot, weighs exactly 0: the same bits whatever
    finite keys and values it holds."""
    query, key, value, mask = split_inputs("GQA", 4, True, 45)
    first = split_decode_attention(query, key, value, mask, 0.25, chunk=CHUNK)
    hidden = ~mask.reshape(ROWS, 2, 4, 45).any(dim=2).unsqueeze(-1)  # (rows, kv_heads, slots, 1)
    key, value = key.masked_fill(hidden, 1e4), value.masked_fill(hidden, -1e4)
    assert torch.equal(split_decode_attention(query, key, value, mask, 0.25, chunk=CHUNK), first)


def test_split_a_head_that_sees_no_slot_gets_zeros_as_from_grouped_sdpa():
    query, key, value, mask = split_inputs("GQA", 4, True, 45)
    mask[0, 1] = False  # row 0's query head 1 sees nothing
    mask[2] = False  # nor does any head of row 2
    output = split_decode_attention(query, key, value, mask, 0.25, chunk=CHUNK)
    assert torch.equal(output[0, 0, 1], torch.zeros(DIM)) and torch.equal(output[2], torch.zeros(1, 8, DIM))
    torch.testing.assert_close(output, grouped_decode_attention(query, key, value, mask, 0.25))


def test_split_a_rows_output_is_the_same_bits_whatever_the_other_rows_hold():
    query, key, value, mask = split_inputs("GQA", 4, True, 45)
    other = split_inputs("GQA", 4, True, 45, seed=1)
    changed = [tensor.clone() for tensor in (query, key, value, mask)]
    for tensor, replacement in zip(changed, other, strict=True):
        tensor[1:] = replacement[1:]  # rows 1 and 2 hold something else
    first = split_decode_attention(query, key, value, mask, 0.25, chunk=CHUNK)
    again = split_decode_attention(*changed, 0.25, chunk=CHUNK)
    assert torch.equal(first[0], again[0])
    assert torch.equal(first, split_decode_attention(query, key, value, mask, 0.25, chunk=CHUNK))  # re-run


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_in_half_precision_is_within_its_rounding_of_the_float64_reference(dtype):
    query, key, value, mask = (
        tensor.to(dtype) if tensor.is_floating_point() else tensor
        for tensor in split_inputs("GQA", 4, True, 45)
    )
    output = split_decode_attention(query, key, value, mask, 0.25, chunk=CHUNK)
    assert output.dtype == dtype
    expected = naive(query, key, value, mask, 0.25)  # of the same rounded inputs
    # computed in float32, rounded once at the end: within one unit in the last place of the reference
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=torch.finfo(dtype).eps)


@pytest.mark.parametrize("family", list(LAYOUTS))
def test_split_on_cuda_multiplies_half_precision_as_it_is_within_flash_rounding(family, monkeypatch):
    """The CUDA path (``aten.bmm.dtype``: bf16 matrices in, float32 out; the weights rounded to bf16 before
    they meet the values, as flash attention does), run here with an emulated ``bmm.dtype``: the
    reshapes around it are right and the result is within bf16 rounding of the float64 reference."""
    from snapeval.cache import decode_attention

    multiplied = []

    def emulated(first, second):
        assert first.dtype == second.dtype == torch.bfloat16  # nothing upcast before the multiply
        multiplied.append(first.shape)
        return torch.bmm(first.float(), second.float())

    monkeypatch.setattr(decode_attention, "_mixes", lambda tensor: tensor.dtype == torch.bfloat16)
    monkeypatch.setattr(decode_attention, "_bmm_float32", emulated)
    query, key, value, mask = (
        tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        for tensor in split_inputs(family, 4, True, 45)
    )
    output = split_decode_attention(query, key, value, mask, 0.25, chunk=CHUNK)
    assert len(multiplied) == 3  # the scores, the whole chunks, the shorter last chunk
    expected = naive(query, key, value, mask, 0.25)
    torch.testing.assert_close(output.double(), expected, atol=1e-2, rtol=2**-6)


def test_split_compiles_into_one_graph_that_equals_eager():
    query, key, value, mask = split_inputs("GQA", 4, True, 21)
    compiled = torch.compile(split_decode_attention, fullgraph=True, dynamic=False)
    output = compiled(query, key, value, mask, 0.25, chunk=CHUNK)
    eager = split_decode_attention(query, key, value, mask, 0.25, chunk=CHUNK)
    torch.testing.assert_close(output, eager, atol=1e-5, rtol=1e-5)
