"""What a row holds has one home (:mod:`snapeval.configs.footprint`): slots per layer, windows included,
and bytes per slot. Its arithmetic on made-up numbers, then one row that has every case at once: an
R-KV row (re-selected while decoding: ``budget + buffer`` slots whatever the prompt) of tiny Gemma 3
(three of four layers with a 64-token window, tests/families.py) and of tiny DeepSeek-V3 (MLA: one cache
head of the latent and its rotary key). The batcher's memory check, the slots it allocates, the
``kv_bytes`` its answer stores and the memory estimator all count that row alike.
"""

from __future__ import annotations

import pytest

from snapeval.cache import install
from snapeval.cache.slots import cached_shapes
from snapeval.configs.footprint import layer_slots, row_slots, slot_bytes
from snapeval.decode import batch_rows
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.errors import SnapevalError
from snapeval.memory import estimate, load_geometry
from snapeval.memory.kv import kv_bytes_per_sequence
from tests.families import FAMILIES, WINDOW

VOCAB = 128
BUDGET, BUFFER = 48, 24
SLOTS = BUDGET + BUFFER  # 72: more than the window, so a windowed layer holds 64
PROMPT, NEW = 40, 40  # the row fills after 32 tokens fed: at least one re-selection
RKV = {"method": "rkv", "budget": BUDGET, "buffer": BUFFER, "window": 4, "kernel": 3}

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_a_full_layer_holds_the_row_and_a_windowed_one_at_most_its_window():
    assert layer_slots(None, 100) == 100 and layer_slots(None, None) is None  # a full layer grows
    assert layer_slots(64, 100) == 64 and layer_slots(64, 10) == 10 and layer_slots(64, None) == 64
    assert row_slots(100, [64, 64, None, 64]) == 3 * 64 + 100  # Gemma 3's pattern
    assert row_slots(100, []) == 0


def test_a_slot_is_heads_times_key_and_value_widths():
    assert slot_bytes(8, 128, 128, 2) == 4096  # Llama 3.1 8B's layer, bf16
    assert 61 * slot_bytes(1, 512, 64, 2) == 70_272  # DeepSeek-R1's latent and rotary key, 61 layers
    assert slot_bytes(8 // 2, 128, 128, 2) == 2048  # one of two tensor-parallel ranks: its heads


@pytest.mark.parametrize("family", ["gemma3", "deepseek_v3"])
def test_an_rkv_row_is_counted_alike_by_the_check_the_rows_the_answer_and_the_estimator(
    family, monkeypatch, tmp_path
):
    model = install(FAMILIES[family](VOCAB))
    model.generation_config.eos_token_id = None
    shapes = cached_shapes(model)
    request = Request(tuple(range(3, 3 + PROMPT)), RKV, NEW)
    assert request.slots_needed == SLOTS
    free = {"bytes": batch_rows.row_bytes(SLOTS, shapes) - 1}
    monkeypatch.setattr(batch_rows, "free_bytes", lambda device: free["bytes"])
    batcher = ContinuousBatcher(model, 1)
    with pytest.raises(SnapevalError, match="^run.batch_size: 1 rows of 72 slots take "):
        batcher.reserve([request])
    free["bytes"] += 1
    answers = []
    batcher.run([request], answers.append)  # fits to the byte
    [slots] = batcher.slots.parts
    held = [SLOTS if window is None else min(window, SLOTS) for window in shapes.windows]
    assert [keys.shape[2] for keys in slots.keys] == held
    assert (family == "gemma3") == (WINDOW in held)
    measured = sum(
        keys[0, :, :n].nbytes + values[0, :, :n].nbytes
        for n, keys, values in zip(held, slots.keys, slots.values, strict=True)
    )
    [answer] = answers
    assert answer.evictions  # the row was re-selected while decoding
    assert answer.kv_bytes == measured == shapes.kv_bytes(SLOTS)
    model.config.save_pretrained(tmp_path)
    geometry = load_geometry(str(tmp_path))
    assert kv_bytes_per_sequence(geometry, SLOTS, "fp32") == measured
    estimated = estimate(geometry, "h100", context=PROMPT, method="rkv", budget=BUDGET, kv_dtype="fp32")
    default_buffer = 128  # the estimator builds the method with its defaults
    assert estimated.kv_bytes_per_sequence_compressed == shapes.kv_bytes(BUDGET + default_buffer)
