"""SnapStream with decode-time re-selection (``cache.reselect_every``) against references written here.

* The re-selection's kept slots == a naive loop reference (softmax attention of the recent queries over
  the held slots, pooled, GQA-reduced; prompt slots and the recent tokens always kept), on random tensors
  and on an MLA layer (per-head keys decompressed one by one).
* A budget holding the prompt and every generated token never evicts: the same greedy tokens as plain
  SnapStream and the full cache.
* At a small budget, decoding re-selects (generated tokens older than a ring would hold stay), never moves
  the prompt, and gives the tokens of a naive generation loop on a plain DynamicCache that gathers the
  reference's slots whenever the row is full; the batcher gives them too.
* Unset, the option changes nothing: no eviction rule, and the stored parameters are the earlier ones.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from snapeval.cache import SnapStreamCache, build_cache, effective_params, install
from snapeval.cache.base import SnapevalCache
from snapeval.cache.eviction import Eviction
from snapeval.cache.method import LayerPrompt, Selection
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.generation import generate, prefill_logits

from .conftest import TINY_VOCAB
from .families import FAMILIES
from .test_cache_reference import TOLERANCE, _attention, reference_keep, run_cache

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

SMALL = {"budget": 24, "ring": 12, "window": 4, "kernel": 3, "sinks": 2, "reselect_every": 4}
PROMPT_LENGTH = 40
NEW_TOKENS = 40


def naive_reselect(
    head_keys: list[torch.Tensor],
    query: torch.Tensor,
    scaling: float,
    group: int,
    prompt_slots: list[list[bool]],
    pinned: int,
    kernel: int,
    pooling: str,
    gqa_reduce: str,
    keep: int,
) -> list[list[int]]:
    """Per cache head, the ascending held slots a re-selection keeps, in float64 loops.

    ``head_keys[h]``: (S, d) the keys query head h scores (held slots in storage order); ``query``:
    (heads, w, d) the last w tokens' queries, those tokens being the last w slots; ``group``: query heads
    per cache head; ``prompt_slots[g][j]``: slot j of cache head g holds a prompt token. Kept first: the
    prompt slots among the first ``pinned``, then the last w slots newest first, then the other prompt
    slots newest first, then the generated slots by score (ties: the earlier slot).
    """
    heads, w, _ = query.shape
    held = head_keys[0].shape[0]
    prefix = held - w
    pooled_heads = []
    for h in range(heads):
        keys = head_keys[h].double()
        summed = [0.0] * held
        for i in range(w):
            logits = [float(query[h, i].double() @ keys[j]) * scaling for j in range(prefix + i + 1)]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            for j, weight in enumerate(weights):
                summed[j] += weight / sum(weights)
        pooled = []
        for j in range(prefix):
            around = [summed[n] for n in range(j - kernel // 2, j + kernel // 2 + 1) if 0 <= n < prefix]
            pooled.append(max(around) if pooling == "max" else sum(around) / kernel)
        pooled_heads.append(pooled)
    kept = []
    for g in range(heads // group):
        members = pooled_heads[g * group : (g + 1) * group]
        scores = [
            sum(m[j] for m in members) / group if gqa_reduce == "mean" else max(m[j] for m in members)
            for j in range(prefix)
        ]
        wanted = [_wanted(j, prompt_slots[g][j], pinned, prefix, scores) for j in range(held)]
        kept.append(sorted(sorted(range(held), key=wanted.__getitem__, reverse=True)[:keep]))
    return kept


def _wanted(slot: int, prompt: bool, pinned: int, prefix: int, scores: list[float]) -> tuple:
    """How much a re-selection wants ``slot`` (higher first): its tier, then the order in it."""
    if prompt and slot < pinned:
        return (3, 0.0, 0)
    if slot >= prefix or prompt:
        return (2 if slot >= prefix else 1, slot, 0)
    return (0, scores[slot], -slot)


def held_positions(generator: torch.Generator, kv_heads: int, prompt: int, pinned: int, held: int, w: int):
    """(1, kv_heads, held) columns as a SnapStream row holds them: ``pinned`` prompt columns ascending,
    then generated ones ascending, the last ``w`` the tokens just fed."""
    rows = []
    for _ in range(kv_heads):
        kept_prompt = torch.randperm(prompt, generator=generator)[:pinned].sort().values
        older = prompt + torch.randperm(30, generator=generator)[: held - pinned - w].sort().values
        rows.append(torch.cat([kept_prompt, older, prompt + 30 + torch.arange(w)]))
    return torch.stack(rows)[None]


@pytest.mark.parametrize("pooling,gqa_reduce,w", [("max", "mean", 4), ("avg", "max", 4), ("max", "mean", 2)])
def test_reselection_keeps_what_the_naive_reference_keeps_on_random_tensors(pooling, gqa_reduce, w):
    generator = torch.Generator().manual_seed(5)
    held, pinned, prompt = 36, 10, 50
    keys = torch.randn(1, 2, held, 8, generator=generator)
    query = torch.randn(1, 6, w, 8, generator=generator) * 2
    positions = held_positions(generator, 2, prompt, pinned, held, w)
    layer = LayerPrompt(
        keys, query, torch.ones(1, held, dtype=torch.bool), 1 / math.sqrt(8), positions=positions
    )
    layer.prompt_length = prompt
    cache = SnapStreamCache(
        budget=held,
        ring=20,
        window=4,
        kernel=5,
        sinks=2,
        pooling=pooling,
        gqa_reduce=gqa_reduce,
        reselect_every=10,
    )
    kept = cache.reselect(layer, keep=20)
    prompt_slots = (positions[0] < prompt).tolist()
    expected = naive_reselect(
        [keys[0, h // 3] for h in range(6)],
        query[0],
        1 / math.sqrt(8),
        3,
        prompt_slots,
        pinned,
        5,
        pooling,
        gqa_reduce,
        20,
    )
    assert kept.shape == (1, 2, 20)
    assert kept[0].tolist() == expected
    assert all(set(range(pinned)) <= set(row) for row in expected)  # the prompt stays
    assert expected[0] != expected[1]  # each KV head chooses on its own


@pytest.mark.parametrize(
    "query,w,keep,every,expected",
    [
        (8, 4, 20, 10, [*range(10), *range(12, 18), *range(26, 30)]),  # the query's first 2 go
        (0, 8, 14, 16, [*range(10), *range(26, 30)]),  # the window's oldest 4 go
    ],
)
def test_when_the_recent_tokens_or_an_appended_query_do_not_fit_the_newest_stay(
    query, w, keep, every, expected
):
    generator = torch.Generator().manual_seed(6)
    held, pinned = 30, 10  # pinned prompt slots, then ``query`` slots of a query appended after prefill
    positions = torch.cat([torch.arange(pinned + query), 40 + torch.arange(held - pinned - query)])
    layer = LayerPrompt(
        torch.randn(1, 2, held, 8, generator=generator),
        torch.randn(1, 4, w, 8, generator=generator),
        torch.ones(1, held, dtype=torch.bool),
        1 / math.sqrt(8),
        positions=positions.expand(1, 2, -1),
        prompt_length=pinned + query,
    )
    cache = SnapStreamCache(budget=36, ring=20, window=8, kernel=3, sinks=2, reselect_every=every)
    kept = cache.reselect(layer, keep=keep)
    assert kept[0].tolist() == [expected] * 2
    prompt_slots = [(positions < pinned + query).tolist()] * 2
    keys = [layer.keys[0, h // 2] for h in range(4)]
    assert (
        naive_reselect(keys, layer.query[0], layer.scaling, 2, prompt_slots, pinned, 3, "max", "mean", keep)
        == [expected] * 2
    )


class Recorder(SnapevalCache):
    """Keeps every layer's prompt as the methods see it."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[LayerPrompt] = []

    def select(self, prompt: LayerPrompt) -> Selection:
        self.prompts.append(prompt)
        return Selection()


@torch.no_grad()
def test_on_mla_the_reselection_scores_the_latent_as_the_per_head_keys():
    model = install(FAMILIES["deepseek_v3"](TINY_VOCAB))
    recorder = Recorder()
    ids = torch.randint(3, TINY_VOCAB, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    prefill_logits(model, ids, recorder)
    w, prompt_length = 3, 20  # the first 20 columns stand for the prompt, the rest for generated tokens
    slots = torch.tensor([0, 1, 4, 7, 9, 12, 15, 19, 21, 22, 24, 25, 26, 27, 28, 29])
    for layer, recorded in enumerate(recorder.prompts):
        module = model.model.layers[layer].self_attn
        held = LayerPrompt(
            recorded.keys[:, :, slots],
            recorded.query[:, :, -w:],
            torch.ones(1, len(slots), dtype=torch.bool),
            recorded.scaling,
            values=recorded.values[:, :, slots],
            module=module,
            positions=slots[None, None],
            prompt_length=prompt_length,
        )
        params = {"budget": 40, "window": 4, "kernel": 3, "ring": 12, "reselect_every": 8}
        cache = build_cache({"method": "snapstream", **params})  # pinned: 12 + 8 - 12 = the 8 prompt slots
        kept = cache.reselect(held, keep=12)
        latent, rotary = held.keys[0, 0], held.values[0, 0]
        nope, width = module.qk_nope_head_dim, module.qk_nope_head_dim + module.v_head_dim
        weight = module.kv_b_proj.weight.double()
        heads = held.query.shape[1]
        ups = [weight[h * width : h * width + nope] for h in range(heads)]
        head_keys = [torch.cat([latent.double() @ up.T, rotary.double()], dim=-1) for up in ups]
        prompt_slots = [(slots < prompt_length).tolist()]
        expected = naive_reselect(
            head_keys, held.query[0], module.scaling, heads, prompt_slots, 8, 3, "max", "mean", 12
        )
        assert kept[0].tolist() == expected
        assert len(set(expected[0]) & set(range(8, 13))) == 12 - 8 - w  # some generated slots were dropped


def test_the_eviction_rule_and_the_stored_parameters():
    plain = {"method": "snapstream", "budget": 256}
    assert SnapStreamCache(budget=256).decode_eviction(300) is None
    assert "reselect_every" not in effective_params(plain)
    assert effective_params(plain) == SnapStreamCache(budget=256).params()  # tests/test_cache_engine.py's
    assert effective_params({**plain, "reselect_every": 16}) == {
        **effective_params(plain),
        "reselect_every": 16,
    }
    cache = SnapStreamCache(budget=256, reselect_every=16)
    assert cache.decode_eviction(300) == Eviction(keep=240, slots=256, every=None, queries=32)
    by_ratio = SnapStreamCache(budget=None, ratio=0.5, window=8, sinks=2, ring=16, reselect_every=4)
    assert by_ratio.decode_eviction(300) == Eviction(keep=146, slots=150, queries=8)
    assert by_ratio.decode_slots(300, 50) == 150


@pytest.fixture(scope="module")
def prompt_ids() -> list[int]:
    generator = torch.Generator().manual_seed(3)
    return torch.randint(3, TINY_VOCAB, (PROMPT_LENGTH,), generator=generator).tolist()


def test_a_budget_holding_everything_never_evicts_and_equals_the_full_cache(tiny_llama, prompt_ids):
    holding = {"budget": PROMPT_LENGTH + NEW_TOKENS + 8, "ring": NEW_TOKENS + 4, "window": 4, "kernel": 3}
    full = generate(tiny_llama, prompt_ids, DynamicCache(), NEW_TOKENS, set()).tokens
    plain = generate(tiny_llama, prompt_ids, SnapStreamCache(**holding), NEW_TOKENS, set()).tokens
    cache = SnapStreamCache(**holding, reselect_every=4)
    reselecting = generate(tiny_llama, prompt_ids, cache, NEW_TOKENS, set()).tokens
    assert reselecting == plain == full
    request = Request(tuple(prompt_ids), {"method": "snapstream", **holding, "reselect_every": 4}, NEW_TOKENS)
    answers = []
    ContinuousBatcher(tiny_llama, rows=1).run([request], answers.append)
    assert answers[0].tokens == full and answers[0].evictions == ()
    fed = PROMPT_LENGTH + NEW_TOKENS - 1  # the last token is drawn, never fed
    for layer in range(len(cache.layers)):
        assert sorted(cache.kept_positions(layer)[0, 0].tolist()) == [-1] * (holding["budget"] - fed) + list(
            range(fed)
        )


def _gather(layer, kept: torch.Tensor) -> None:
    """Keep the slots ``kept`` (kv_heads, n) of a DynamicCache layer, in that order."""
    index = kept[None, :, :, None].expand(1, -1, -1, layer.keys.shape[-1])
    layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)


def reference_generation(model, prompt_ids: list[int], params: dict, steps: int):
    """Greedy tokens of SnapStream with ``reselect_every`` written from its definition on a plain
    DynamicCache: the naive SnapKV(+sinks) prefill selection of ``budget - ring`` prompt columns, then
    whenever a layer holds ``budget`` tokens, the naive re-selection keeps ``budget - reselect_every`` of
    them. Returns the tokens fed, the logits after each, and every layer's held columns (kv_heads, held)
    at the end."""
    budget, window, every = params["budget"], params["window"], params["reselect_every"]
    queries: dict[int, list[torch.Tensor]] = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        queries.setdefault(module.layer_idx, []).append(query[0].clone())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    cache, length, tokens, step_logits = DynamicCache(), len(prompt_ids), [], []
    attention = [layer.self_attn for layer in model.model.layers]
    with _attention(model, "reselect_reference", capture), torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt_ids]), past_key_values=cache).logits[0, -1]
        positions = {}
        for index, layer in enumerate(cache.layers):
            pinned = reference_keep(
                queries[index].pop(),
                layer.keys[0],
                window,
                params["kernel"],
                "max",
                "mean",
                keep=budget - params["ring"],
                sinks=params["sinks"],
            )
            positions[index] = torch.tensor(pinned)
            _gather(layer, positions[index])
        for step in range(steps):
            tokens.append(int(logits.argmax()))
            column = length + step
            logits = model(
                input_ids=torch.tensor([[tokens[-1]]]),
                position_ids=torch.tensor([[column]]),
                past_key_values=cache,
            ).logits[0, -1]
            step_logits.append(logits)
            for index, layer in enumerate(cache.layers):
                held = torch.cat([positions[index], torch.full_like(positions[index][:, :1], column)], dim=1)
                positions[index] = held
                if held.shape[1] < budget:
                    continue
                recent = torch.cat(queries[index][-window:], dim=1)
                group = recent.shape[0] // held.shape[0]
                kept = naive_reselect(
                    [layer.keys[0, h // group] for h in range(recent.shape[0])],
                    recent,
                    attention[index].scaling,
                    group,
                    (held < length).tolist(),
                    budget - params["ring"],
                    params["kernel"],
                    "max",
                    "mean",
                    budget - every,
                )
                positions[index] = held.gather(1, torch.tensor(kept))
                _gather(layer, torch.tensor(kept))
    return tokens, torch.stack(step_logits), positions


def test_reselection_decodes_as_the_naive_generation_loop_and_the_batcher(tiny_llama, prompt_ids):
    params, plain = (
        {"method": "snapstream", **SMALL},
        {"method": "snapstream", **SMALL, "reselect_every": None},
    )
    steps, pinned = NEW_TOKENS - 1, SMALL["budget"] - SMALL["ring"]  # generate feeds all but the last token
    expected, expected_logits, reference_held = reference_generation(tiny_llama, prompt_ids, SMALL, steps)
    after_prefill = build_cache(params)
    prefill_logits(tiny_llama, prompt_ids, after_prefill)
    cache = build_cache(params)
    tokens, logits = run_cache(tiny_llama, prompt_ids, cache, steps)
    assert tokens == expected
    assert (logits - expected_logits).abs().max().item() < TOLERANCE
    ring_logits = run_cache(tiny_llama, prompt_ids, build_cache(plain), steps)[1]
    assert (ring_logits - expected_logits).abs().max().item() > 100 * TOLERANCE  # re-selection shows
    newest = PROMPT_LENGTH + steps - 1  # the column of the last token fed
    for index, (layer, prefilled) in enumerate(zip(cache.layers, after_prefill.layers, strict=True)):
        held = layer.positions[0]
        assert torch.equal(held[held >= 0].view(held.shape[0], -1), reference_held[index])
        assert torch.equal(held[:, :pinned], prefilled.positions[0, :, :pinned])  # the prompt never moves
        assert torch.equal(layer.keys[:, :, :pinned], prefilled.keys[:, :, :pinned])
        generated = held[:, pinned:]
        assert (generated[generated >= 0] < newest - SMALL["ring"] + 1).any()  # older than a ring holds
    requests = [
        Request(tuple(prompt_ids), cache, NEW_TOKENS, tag=i) for i, cache in enumerate([params, plain])
    ]
    got = {}
    ContinuousBatcher(tiny_llama, rows=2).run(
        requests, lambda answer: got.__setitem__(answer.request.tag, answer)
    )
    assert got[0].tokens == generate(tiny_llama, prompt_ids, build_cache(params), NEW_TOKENS, set()).tokens
    assert got[0].tokens[:steps] == expected
    assert got[0].evictions == (12, 16, 20, 24, 28, 32, 36)  # full after 12 tokens, then every 4
    assert got[0].kept_generated_share == pytest.approx(11 / steps)  # 8 kept at 36, 3 fed since
    assert got[1].evictions == () and got[1].ring_wraps > 0
    assert got[1].kept_generated_share == pytest.approx(12 / steps)  # the ring: the last 12


def test_a_query_appended_after_prefill_keeps_its_last_tokens_in_both_paths(tiny_llama, prompt_ids):
    params, at = {"method": "snapstream", **SMALL}, 30  # 12 pinned + 10 appended: over 20 - w
    cache = build_cache(params)
    alone = generate(tiny_llama, prompt_ids, cache, 30, set(), compress_at=at).tokens
    answers = []
    request = Request(tuple(prompt_ids), params, 30, compress_at=at)
    ContinuousBatcher(tiny_llama, rows=1).run([request], answers.append)
    assert answers[0].tokens == alone and answers[0].evictions == (2, 6, 10, 14, 18, 22, 26)
    for layer in range(len(cache.layers)):
        held = cache.kept_positions(layer)[0]
        query = held[(held >= at) & (held < PROMPT_LENGTH)].view(held.shape[0], -1)
        assert query.tolist() == [[36, 37, 38, 39]] * 2  # 20 - 12 pinned - 4 recent
        assert (held[:, :12] < at).all() and held[:, 16:23].tolist() == [list(range(62, 69))] * 2


@pytest.mark.parametrize("family", ["deepseek_v3", "gemma3"])
def test_mla_and_sliding_window_families_reselect_alike_in_both_paths(family, prompt_ids):
    model = install(FAMILIES[family](TINY_VOCAB))
    model.generation_config.eos_token_id = None
    params = {"method": "snapstream", **SMALL}
    cache = build_cache(params)
    alone = generate(model, prompt_ids, cache, 30, set()).tokens
    answers = []
    ContinuousBatcher(model, rows=1).run([Request(tuple(prompt_ids), params, 30)], answers.append)
    assert answers[0].tokens == alone and answers[0].evictions == (12, 16, 20, 24, 28)
    fed = PROMPT_LENGTH + 29
    for layer in cache.layers:
        held = sorted(c for c in layer.positions[0, 0].tolist() if c >= 0)
        if layer.window is not None:  # a sliding-window layer keeps its ring: the last tokens fed
            assert held == list(range(fed - SMALL["budget"], fed))
        else:
            assert len(held) == 21 and held[-5:] == list(range(fed - 5, fed))  # 12 + 8 + 1 fed since
