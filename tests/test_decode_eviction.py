"""Decode-time eviction in the engine (:mod:`snapeval.cache.eviction`), with a toy method whose choice a
few lines of plain Python can redo: keep the most recent queried tokens and the held keys of largest norm.

* A single-sequence cache re-selects exactly where, and keeps exactly what, a naive loop over a plain
  transformers ``DynamicCache`` does; both rules (when full, every N steps) and the kept order.
* The batcher's rows (mixed with methods that never re-select, and a grid of both rules sharing each
  prompt's prefill) give exactly the one-by-one tokens. (tests/test_continuous.py runs the compiled step
  over >= 200 steps with this toy's re-selections from one graph.)
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import DynamicCache

from snapeval.cache import build_cache
from snapeval.cache.base import SnapevalCache
from snapeval.cache.eviction import Eviction
from snapeval.cache.method import LayerPrompt, Selection
from snapeval.decode.continuous import Request
from snapeval.decode.generation import generate
from snapeval.decode.sampling import Sampling

from .batched import answers_equal_alone

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
TOY = "tests.test_decode_eviction:KeyNormEviction"


@dataclass
class KeyNormParams:
    budget: int = 12
    buffer: int = 6
    every: int | None = None  # None: re-select when full
    recent: int = 3


class KeyNormEviction(SnapevalCache):
    """Rows of budget + buffer slots; a re-selection keeps the last ``recent`` held slots (the queried
    tokens) and the held keys of largest norm, largest first, then the recent ones."""

    method = TOY
    params_class = KeyNormParams

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return self.budget + self.buffer

    def decode_eviction(self, prompt_length: int) -> Eviction:
        return Eviction(self.budget, self.budget + self.buffer, self.every, queries=self.recent)

    def select(self, prompt: LayerPrompt) -> Selection:
        assert prompt.length <= self.budget  # the tests' prompts fit
        return Selection(capacity=self.budget + self.buffer)

    def reselect(self, held: LayerPrompt, keep: int) -> torch.Tensor:
        window = held.query.shape[2]
        assert held.query.shape[1] == 4 and window == min(self.recent, held.length)
        older = held.keys[:, :, : held.length - window].float().norm(dim=-1)
        best = older.topk(keep - window, dim=-1).indices
        recent = torch.arange(held.length - window, held.length).expand(*best.shape[:2], window)
        return torch.cat([best, recent], dim=-1)


def naive_order(keys: torch.Tensor, keep: int, recent: int) -> list[list[int]]:
    """Per head, the toy's kept slots of ``keys`` (1, heads, held, d): largest norms first, then recent."""
    held = keys.shape[2]
    orders = []
    for head in range(keys.shape[1]):
        norms = [float(keys[0, head, slot].detach().float().norm()) for slot in range(held - recent)]
        best = sorted(range(held - recent), key=lambda slot: -norms[slot])[: keep - recent]
        orders.append(best + list(range(held - recent, held)))
    return orders


def naive_generation(model, prompt: list[int], steps: int, params: KeyNormParams):
    """Greedy decoding on a plain DynamicCache, each layer gathered as the toy says when its rule is due;
    returns the tokens, each layer's columns per head, and the steps at which it re-selected."""
    cache = DynamicCache()
    logits = model(torch.tensor([prompt]), past_key_values=cache).logits[0, -1]
    layers, heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    columns = [[list(range(len(prompt))) for _ in range(heads)] for _ in range(layers)]
    tokens, evictions, since = [], [], 0
    for step in range(1, steps + 1):
        tokens.append(int(logits.argmax()))
        position = torch.tensor([[len(prompt) + step - 1]])
        logits = model(torch.tensor([tokens[-1:]]), past_key_values=cache, position_ids=position).logits[
            0, -1
        ]
        since += 1
        for layer_columns in columns:
            for head_columns in layer_columns:
                head_columns.append(int(position))
        held = len(columns[0][0])
        if since >= params.every if params.every else held >= params.budget + params.buffer:
            since = 0
            if held > params.budget:
                evictions.append(step)
                for index, layer in enumerate(cache.layers):
                    orders = naive_order(layer.keys, params.budget, params.recent)
                    columns[index] = [[columns[index][h][s] for s in order] for h, order in enumerate(orders)]
                    gather = torch.tensor([orders])[..., None].expand(-1, -1, -1, layer.keys.shape[-1])
                    layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
    return tokens, columns, evictions


RULES = [KeyNormParams(), KeyNormParams(budget=10, buffer=5, every=4)]


@pytest.mark.parametrize("params", RULES, ids=["when-full", "every-4"])
def test_a_cache_re_selects_where_and_what_a_naive_loop_does(tiny_llama, params):
    prompt = list(range(5, 13))
    steps = 30
    expected, columns, evictions = naive_generation(tiny_llama, prompt, steps, params)
    cache = build_cache({"method": TOY, **vars(params)})
    got = generate(tiny_llama, prompt, cache, steps + 1, set())
    assert got.tokens[:steps] == expected
    assert len(evictions) >= 3
    for index, layer in enumerate(cache.layers):  # after the same steps fed: the same columns, in order
        assert layer.positions[0, :, : layer.filled].tolist() == columns[index]
        assert bool((layer.positions[0, :, layer.filled :] == -1).all())


def mixed_requests(count: int, max_new: int) -> list[Request]:
    """Prompts of 5-10 tokens under both rules, next to rows that never re-select; some sampled."""
    generator = torch.Generator().manual_seed(7)
    settings = [
        {"method": TOY, **vars(RULES[0])},
        {"method": TOY, **vars(RULES[1])},
        {"method": "full"},
        {"method": "snapstream", "budget": 16, "window": 2, "kernel": 3, "sinks": 1, "ring": 6},
    ]
    requests = []
    for index in range(count):
        length = int(torch.randint(5, 11, (1,), generator=generator))
        ids = tuple(torch.randint(3, 500, (length,), generator=generator).tolist())
        sampling = Sampling(do_sample=index % 3 == 0, temperature=0.8, seed=index)
        requests.append(Request(ids, settings[index % len(settings)], max_new, sampling, tag=index))
    return requests


def test_rows_re_select_as_the_one_by_one_path_does_and_a_grid_shares_the_prefill(tiny_llama):
    """Two of every setting per prompt (one prefill for the grid of them), 3 rows refilled: every
    answer's tokens are those of its request alone, and the evicting rows report their re-selections."""
    requests = mixed_requests(8, max_new=40)
    twins = [
        Request(r.prompt_ids, {"method": TOY, **vars(rule)}, 40, r.sampling, tag=(r.tag, n))
        for r in requests[:4]
        for n, rule in enumerate(RULES)
    ]
    got = answers_equal_alone(tiny_llama, requests + twins)
    evicting = [got[r.tag] for r in requests + twins if r.cache.method == TOY]
    assert all(len(answer.evictions) >= 3 for answer in evicting)
    assert all(0 < answer.kept_generated_share < 1 for answer in evicting)
    assert all(answer.ring_wraps == 0 for answer in evicting)  # a full row re-selects, it never wraps
    full = [got[r.tag] for r in requests if r.cache.is_full]
    assert all(answer.evictions == () and answer.kept_generated_share is None for answer in full)
