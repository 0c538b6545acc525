"""The bytes of a decode row have one home (:mod:`snapeval.configs.footprint`): the batcher's memory
check, the slot cache it then allocates and the memory estimator count the same row, sliding windows
included, to the byte.

Tiny random Gemma 3 (layers sliding, sliding, full, sliding) and GPT-OSS (sliding, full), both with 2 KV
heads of 16 dimensions in fp32 and 64-token windows (tests/families.py), one row of 100 slots (a 90-token
prompt and 10 new tokens under the full cache). A layer holds 100 slots, a windowed one 64; a slot of
one layer is 2 x 2 x 16 x 4 = 256 bytes of keys and values. What each side counts:

* the check (:func:`snapeval.decode.batch_rows.check_rows_fit`, from :meth:`ContinuousBatcher.reserve`): keys
  and values, an int64 position per slot and KV head, and a bool valid flag per slot of each ring (one
  for the full layers, one for the 64-token window): it refuses the row with one byte less free;
* the slot cache: the bytes of the buffers it allocates for that row (``keys``, ``values``, ``positions``
  and each ring's ``valid``; its cursors, per row and ring, are not counted);
* the estimator (:func:`snapeval.memory.estimate`, from the saved config): keys and values of one
  sequence of 100 tokens.
"""

from __future__ import annotations

import pytest

from snapeval.cache import install
from snapeval.cache.slots import SlotCache, cached_shapes
from snapeval.decode import batch_rows
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.errors import SnapevalError
from snapeval.memory import estimate, load_geometry
from tests.families import FAMILIES, WINDOW

VOCAB = 128
PROMPT, NEW = 90, 10
SLOTS = PROMPT + NEW
SLOT_LAYER = 2 * 2 * 16 * 4  # (keys, values) x KV heads x head_dim x fp32
# family -> slots held summed over layers: 3 windowed layers and 1 full; 1 windowed and 1 full
HELD = {"gemma3": 3 * WINDOW + SLOTS, "gpt_oss": WINDOW + SLOTS}
KV_BYTES = {"gemma3": 74_752, "gpt_oss": 41_984}
ROW_BYTES = {"gemma3": 79_588, "gpt_oss": 44_772}  # + positions (held x 2 heads x 8) + flags (100 + 64)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def allocated(slots: SlotCache) -> tuple[int, int]:
    """(keys and values, keys and values + positions + valid flags) bytes of a one-row slot cache."""
    kv = sum(tensor.nbytes for tensor in [*slots.keys, *slots.values])
    flags = [rings.valid for rings in slots.rings.values()]
    return kv, kv + sum(tensor.nbytes for tensor in [*slots.positions, *flags])


def test_the_figures_count_the_windows():
    assert HELD == {"gemma3": 292, "gpt_oss": 164}
    assert all(KV_BYTES[family] == HELD[family] * SLOT_LAYER for family in HELD)
    assert all(
        ROW_BYTES[family] == KV_BYTES[family] + HELD[family] * 2 * 8 + SLOTS + WINDOW for family in HELD
    )


@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])
def test_the_check_the_slot_cache_and_the_estimator_count_one_row_alike(family, monkeypatch, tmp_path):
    model = install(FAMILIES[family](VOCAB))
    request = Request(tuple(range(3, 3 + PROMPT)), {"method": "full"}, NEW)
    batcher = ContinuousBatcher(model, 1)
    free = {"bytes": ROW_BYTES[family] - 1}
    monkeypatch.setattr(batch_rows, "free_bytes", lambda device: free["bytes"])
    with pytest.raises(SnapevalError, match="^run.batch_size: 1 rows of 100 slots take "):
        batcher.reserve([request])
    free["bytes"] = ROW_BYTES[family]
    batcher.reserve([request])  # fits to the byte
    [slots] = batcher.slots.parts
    assert (slots.rows, slots.capacity) == (1, SLOTS)
    assert [keys.shape[2] for keys in slots.keys] == [
        SLOTS if window is None else WINDOW for window in cached_shapes(model).windows
    ]
    assert allocated(slots) == (KV_BYTES[family], ROW_BYTES[family])
    assert batch_rows.row_bytes(SLOTS, cached_shapes(model)) == ROW_BYTES[family]
    assert cached_shapes(model).kv_bytes(SLOTS) == slots.shapes.kv_bytes(SLOTS) == KV_BYTES[family]
    model.config.save_pretrained(tmp_path)
    estimated = estimate(load_geometry(str(tmp_path)), "h100", context=SLOTS, kv_dtype="fp32")
    assert estimated.kv_bytes_per_sequence_full == KV_BYTES[family]
