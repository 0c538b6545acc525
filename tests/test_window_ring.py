"""A sliding-window layer holds exactly its window: ``min(window, the method's slots)`` slots, on every path.

Tiny random Mistral (every layer slides) and Gemma 3 (sliding and global layers) with 64-token windows
(tests/families.py) and a 300-token prompt: a single-sequence cache after prefill and after decoding, the
rows of the batcher's slot cache, and the members of a shared-prefill grid. Full layers hold what the
method holds; windowed layers at most their window, fewer where the method holds fewer. A windowed ring
of the full cache or StreamingLLM holds exactly the newest tokens (exactness against transformers is
tests/test_family_matrix.py's).
"""

from __future__ import annotations

import pytest
import torch

from snapeval.cache import build_cache, install
from snapeval.cache.grid import CacheGrid
from snapeval.cache.slots import SlotCache, cached_shapes
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.generation import generate
from snapeval.memory import kv_bytes_per_sequence, load_geometry
from tests.families import FAMILIES, WINDOW

VOCAB = 512
PROMPT = 300
NEW = 12
# method -> (its parameters, slots it holds on a full layer after prefill)
METHODS = {
    "full": ({"method": "full"}, PROMPT),
    "streaming_llm": ({"method": "streaming_llm", "budget": 40, "sinks": 4}, 40),  # fewer than the window
    "snapkv": ({"method": "snapkv", "budget": 96, "window": 8}, 96),
    "snapstream": ({"method": "snapstream", "budget": 128}, 128),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module", params=["mistral", "gemma3", "gpt_oss"])
def model(request):
    model = install(FAMILIES[request.param](VOCAB))
    model.generation_config.eos_token_id = None
    return model


def ids() -> list[int]:
    return torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()


def windows(model) -> list[int | None]:
    """Each layer's window as its config states it (transformers' rule)."""
    config = model.config
    types = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
    return [config.sliding_window if kind == "sliding_attention" else None for kind in types]


def expected_slots(model, slots: int) -> list[int]:
    return [slots if window is None else min(window, slots) for window in windows(model)]


def test_the_families_have_windowed_layers(model):
    assert WINDOW in windows(model) and WINDOW < PROMPT


@pytest.mark.parametrize("method", METHODS)
def test_a_single_sequence_cache_holds_the_window(model, method):
    params, held = METHODS[method]
    cache = build_cache(params)
    generate(model, ids(), cache, NEW, set())
    grows = method in ("full", "snapkv")
    after = held + NEW if grows else held  # the last token generated is never fed
    slots = [layer.keys.shape[2] for layer in cache.layers]
    assert slots == expected_slots(model, after - 1 if grows else after)
    for layer, count, window in zip(cache.layers, slots, windows(model), strict=True):
        if window is None:
            continue
        newest = set(range(layer.seen - count, layer.seen))  # a ring full of the newest tokens
        for head in layer.positions[0]:
            held = set(head[head >= 0].tolist())
            if method in ("full", "streaming_llm"):  # they keep every recent prompt token
                assert held == newest
            else:  # every generated token, the rest chosen from the prompt
                assert set(range(PROMPT, layer.seen)) <= held <= set(range(layer.seen))


@pytest.mark.parametrize("method", METHODS)
def test_the_batchers_rows_and_a_grids_members_hold_the_window(model, method, tmp_path):
    params, held = METHODS[method]
    capacity = held + NEW
    slots = SlotCache.for_model(model, rows=2, capacity=capacity)
    assert [keys.shape[2] for keys in slots.keys] == expected_slots(model, capacity)
    answers = []
    batcher = ContinuousBatcher(model, 2)
    requests = [Request(tuple(ids()), params, NEW, tag=0), Request(tuple(ids()), params, NEW, tag=1)]
    batcher.run(requests, answers.append)
    assert [keys.shape[2] for keys in batcher.slots.parts[0].keys] == expected_slots(
        model, batcher.slots.capacity
    )
    per_layer = [
        keys[0, :, 0].numel() * keys.element_size() + values[0, :, 0].numel() * values.element_size()
        for keys, values in zip(batcher.slots.parts[0].keys, batcher.slots.parts[0].values, strict=True)
    ]
    grows = method in ("full", "snapkv")
    tokens = held + NEW - 1 if grows else held  # a growing row holds every token fed to it
    stored = expected_slots(model, tokens)
    assert answers[0].kv_bytes == sum(n * b for n, b in zip(stored, per_layer, strict=True))
    model.config.save_pretrained(tmp_path)  # the memory estimator counts the same bytes
    assert answers[0].kv_bytes == kv_bytes_per_sequence(load_geometry(str(tmp_path)), tokens, "fp32")
    assert cached_shapes(model).kv_bytes(tokens) == answers[0].kv_bytes  # and the check
    members = [build_cache(params), build_cache({"method": "full"})]
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids()]), past_key_values=CacheGrid(members))
    assert [layer.keys.shape[2] for layer in members[0].layers] == expected_slots(model, held)
    assert [layer.keys.shape[2] for layer in members[1].layers] == expected_slots(model, PROMPT)
