"""kvpress's decoding presses as ``cache=kvpress cache.decoding=true``: the same positions, in the same
storage order, and the same logits at every decode step as kvpress's own ``DecodingPress`` (a prompt
longer than the budget: ``PrefillDecodingPress``) on a tiny random Llama in float64, teacher-forced.
Skipped without kvpress (`pip install "snapeval[kvpress]"`; `.ci/run` runs them in a venv at the lowest
supported transformers)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from snapeval.cache import build_cache, install
from snapeval.errors import SnapevalError
from tests.families import FAMILIES

from .batched import answers_equal_alone

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
KVPRESS = "needs kvpress (pip install 'snapeval[kvpress]')"
VOCAB = 512
BUDGET, INTERVAL, STEPS = 12, 8, 3 * 8 + 2  # compressions at decode steps 8, 16 and 24
PRESSES = {  # press -> (press_args, hidden_states_buffer_size)
    "KnormPress": ({}, 0),
    # kvpress hands the press its buffer and the step's own input: 4 + 1 > window_size, as SnapKV asserts
    "SnapKVPress": ({"window_size": 4, "kernel_size": 3}, 4),
    # reads every buffered input (after its 4 sinks): a buffer one short or one long changes the scores
    "ExpectedAttentionPress": ({}, 6),
    # scores from its compression_ratio, which DecodingPress sets to the ratio that keeps the budget
    "StreamingLLMPress": ({"n_sink": 2}, 0),
}


@pytest.fixture(scope="module")
def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same tiny random Llama twice, in float64 (so that no float summation order flips a top-k):
    as transformers made it (SDPA, which returns no attention weights, as kvpress expects), and with the
    snapeval attention."""
    pytest.importorskip("kvpress", reason=KVPRESS)
    return FAMILIES["llama"](VOCAB).double(), install(FAMILIES["llama"](VOCAB).double())


def tokens(count: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def kvpress_press(name: str, prompt_length: int):
    """kvpress's own press for ``name``: DecodingPress, behind the same press cutting the prompt to the
    budget at prefill (PrefillDecodingPress) where the prompt is longer."""
    import kvpress

    arguments, buffer = PRESSES[name]
    press_class = getattr(kvpress, name)
    decoding = kvpress.DecodingPress(
        base_press=press_class(**arguments),
        compression_interval=INTERVAL,
        target_size=BUDGET,
        hidden_states_buffer_size=buffer,
    )
    if prompt_length <= BUDGET:
        return decoding
    ratio = decoding._find_target_compression_ratio(prompt_length, BUDGET)
    prefilling = press_class(compression_ratio=ratio, **arguments)
    return kvpress.PrefillDecodingPress(prefilling_press=prefilling, decoding_press=decoding)


def run_kvpress(model, prompt, generated, press) -> tuple[list, list]:
    """Teacher-force ``prompt`` then ``generated`` one token per call through kvpress's ``press`` on a
    DynamicCache: the logits of every decode step, and per step, layer and KV head the positions the cache
    holds in storage order. kvpress keeps keys, not positions: each key the run feeds a layer is noted
    (by a hook that runs before kvpress's) under its position, and each held key is matched to them."""
    fed = {}  # layer -> (heads, positions, d) keys in position order

    def note(module, args, kwargs, output):
        index, length = module.layer_idx, len(kwargs["cache_position"])
        new = kwargs["past_key_values"].layers[index].keys[0, :, -length:]
        fed[index] = torch.cat([fed[index], new], dim=1) if index in fed else new

    attentions = [layer.self_attn for layer in model.model.layers]
    hooks = [module.register_forward_hook(note, with_kwargs=True) for module in attentions]
    cache, logits, held = DynamicCache(), [], []
    try:
        with torch.inference_mode(), press(model):
            model(input_ids=torch.tensor([prompt]), past_key_values=cache)
            for step, token in enumerate(generated):
                position = torch.tensor([len(prompt) + step])
                out = model(
                    input_ids=torch.tensor([[token]]),
                    past_key_values=cache,
                    position_ids=position[None],
                    cache_position=position,
                )
                logits.append(out.logits[0, -1])
                held.append([positions_of(layer.keys[0], fed[i]) for i, layer in enumerate(cache.layers)])
    finally:
        for hook in hooks:
            hook.remove()
    return logits, held


def positions_of(held: torch.Tensor, fed: torch.Tensor) -> list[list[int]]:
    """Per head, the position of each held key (heads, n, d) among the keys fed (heads, positions, d)."""
    same = (held[:, :, None] == fed[:, None]).all(dim=-1)  # (heads, n, positions)
    assert (same.sum(dim=-1) == 1).all()  # every held key is exactly one the run fed
    return same.int().argmax(dim=-1).tolist()


def run_snapeval(model, prompt, generated, params) -> tuple[list, list]:
    """The same teacher-forced run through snapeval's single-sequence cache: logits per decode step, and
    per step, layer and KV head the positions held in storage order."""
    cache = build_cache(params)
    logits, held = [], []
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt]), past_key_values=cache)
        for token in generated:
            logits.append(model(input_ids=torch.tensor([[token]]), past_key_values=cache).logits[0, -1])
            held.append(
                [
                    [[p for p in head if p >= 0] for head in cache.kept_positions(layer)[0].tolist()]
                    for layer in range(len(cache.layers))
                ]
            )
    return logits, held


def snapeval_params(name: str) -> dict:
    arguments, buffer = PRESSES[name]
    return {
        "method": "kvpress",
        "press": name,
        "press_args": str(arguments).replace("'", '"'),
        "budget": BUDGET,
        "decoding": True,
        "compression_interval": INTERVAL,
        "hidden_states_buffer_size": buffer,
    }


@pytest.mark.parametrize("prompt_length", [3, 7, 20])
@pytest.mark.parametrize("name", list(PRESSES))
def test_decoding_keeps_what_kvpress_decoding_press_keeps_and_computes_the_same_logits(
    models, name, prompt_length
):
    """A prompt of 3 reaches only 11 tokens at the first due step (kvpress leaves it, and resets its
    count and buffer); one of 7 is cut at every due step; one of 20 is cut to the budget at prefill first
    (PrefillDecodingPress), then at every due step."""
    reference, installed = models
    prompt, generated = tokens(prompt_length, 1), tokens(STEPS, 2)
    theirs = run_kvpress(reference, prompt, generated, kvpress_press(name, prompt_length))
    ours = run_snapeval(installed, prompt, generated, snapeval_params(name))
    for step, (mine, other) in enumerate(zip(ours[1], theirs[1], strict=True)):
        assert mine == other, f"decode step {step + 1}"
    for step, (mine, other) in enumerate(zip(ours[0], theirs[0], strict=True)):
        torch.testing.assert_close(mine, other, rtol=1e-9, atol=1e-9, msg=f"decode step {step + 1}")
    held = [len(step[0][0]) for step in ours[1]]
    start = min(prompt_length, BUDGET)
    cut = [step for step in range(1, STEPS + 1) if held[step - 1] == BUDGET and step % INTERVAL == 0]
    assert cut == ([16, 24] if prompt_length == 3 else [8, 16, 24])
    assert held[INTERVAL - 2] == start + INTERVAL - 1  # no cut before a due step
    assert held[-1] == BUDGET + STEPS % INTERVAL


def test_a_row_holds_budget_plus_interval_slots_and_is_cut_every_interval():
    pytest.importorskip("kvpress", reason=KVPRESS)
    cache = build_cache(snapeval_params("SnapKVPress"))
    eviction = cache.decode_eviction(100)
    assert (eviction.keep, eviction.slots, eviction.every) == (BUDGET, BUDGET + INTERVAL, INTERVAL)
    assert eviction.hidden == 4 + 1  # kvpress's buffer and the step's own attention input
    assert cache.decode_slots(100, 4096) == BUDGET + INTERVAL
    prefill_only = build_cache({"method": "kvpress", "press": "SnapKVPress", "budget": BUDGET})
    assert prefill_only.decode_eviction(100) is None
    assert prefill_only.decode_slots(100, 50) == BUDGET + 50
    assert "decoding" not in prefill_only.params() and "compression_interval" not in prefill_only.params()


def test_decoding_refuses_a_press_kvpress_decoding_press_does_not_take():
    pytest.importorskip("kvpress", reason=KVPRESS)
    with pytest.raises(SnapevalError, match=r"^cache.press: FinchPress is not a ScorerPress"):
        build_cache({"method": "kvpress", "press": "FinchPress", "budget": 8, "decoding": True})


def test_batched_rows_decode_as_one_by_one_and_a_grid_shares_the_prefill(tiny_llama):
    """Rows of both presses, prompts under and over the budget, next to full-cache rows, 3 rows refilled
    (the batcher's step records the attention inputs the presses read): every answer's tokens are those
    of its request alone, and the compressing rows report a re-selection every interval."""
    pytest.importorskip("kvpress", reason=KVPRESS)
    from snapeval.decode.continuous import Request
    from snapeval.decode.sampling import Sampling

    settings = [snapeval_params("SnapKVPress"), snapeval_params("ExpectedAttentionPress"), {"method": "full"}]
    requests = []
    for index, length in enumerate([5, 20, 9, 16, 7, 24]):
        sampling = Sampling(do_sample=index % 2 == 0, temperature=0.8, seed=index)
        for n, cache in enumerate(settings):  # one prompt, three settings: a grid sharing its prefill
            requests.append(Request(tuple(tokens(length, index)), cache, 30, sampling, tag=(index, n)))
    got = answers_equal_alone(tiny_llama, requests)
    for request in requests:
        answer = got[request.tag]
        if request.cache.is_full:
            assert answer.evictions == ()
        else:  # held at a due step: min(prompt, budget) + 8 * k > budget whenever the prompt is over 4
            assert answer.evictions == (8, 16, 24)
            assert 0 < answer.kept_generated_share < 1
