"""The decode step's grouped attention (snapeval/cache/decode_attention.py) against a naive float64
reference: random held-slot layouts (a mask per row, or per query head as a sliding window's), GQA groups
of 1, 4 and 8, value widths apart from the key's (MLA); and a row's output does not depend on the others."""

from __future__ import annotations

import math

import pytest
import torch

from snapeval.cache.decode_attention import grouped_decode_attention

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


def inputs(kv_heads: int, group: int, value_dim: int, per_head: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    heads = kv_heads * group
    query = torch.randn(ROWS, heads, 1, DIM, generator=generator)
    key = torch.randn(ROWS, kv_heads, SLOTS, DIM, generator=generator)
    value = torch.randn(ROWS, kv_heads, SLOTS, value_dim, generator=generator)
    mask = torch.rand(ROWS, heads if per_head else 1, 1, SLOTS, generator=generator) < 0.6
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


@pytest.mark.parametrize("per_head", [False, True], ids=["row mask", "per-head mask"])
def test_absorbed_mla_decode_equals_attention_over_the_expanded_keys_and_values(per_head):
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
    absorbed = absorbed_decode_attention(query, latent, rotary, mask, module.scaling, projections)
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
