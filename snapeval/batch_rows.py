"""How many decode rows a run gets: ``run.batch_size``, capped by what the run can use (its number
of requests) and refused in one line when the rows would not fit in the memory free on the device.

A row holds ``capacity`` slots in every layer and KV head: keys, values and their positions
(:class:`snapeval.cache.slots.SlotCache`), so its bytes are the slot's bytes (the memory estimator's
bytes per token, :func:`snapeval.memory.kv.kv_bytes_per_token`, plus an 8-byte position per layer and
head) times the capacity.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from snapeval.errors import SnapevalError

FIELD = "run.batch_size"
POSITION_BYTES = 8  # an int64 position per slot, layer and KV head
MEMINFO = Path("/proc/meminfo")


def usable_rows(batch_size: int, requests: int) -> int:
    """Rows worth allocating: no more than the requests that can be in flight at once."""
    return max(1, min(batch_size, requests))


def row_bytes(capacity: int, shapes: tuple[int, int, int, int, torch.dtype]) -> int:
    """Bytes of one row of ``capacity`` slots for a model caching ``shapes`` (layers, KV heads, key width,
    value width, dtype; :func:`snapeval.cache.slots.cached_shapes`)."""
    layers, kv_heads, key_dim, value_dim, dtype = shapes
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_slot = layers * kv_heads * ((key_dim + value_dim) * itemsize + POSITION_BYTES) + 1  # + valid flag
    return capacity * per_slot


def free_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on ``device`` (a CUDA device's free memory; on the CPU the system's
    available memory), or None where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_rows_fit(rows: int, capacity: int, shapes: tuple, device: torch.device) -> None:
    """Refuse ``rows`` rows of ``capacity`` slots that the memory free on ``device`` cannot hold."""
    per_row = row_bytes(capacity, shapes)
    free = free_bytes(device)
    if free is None or rows * per_row <= free:
        return
    gib, most = 2**30, free // per_row
    advice = f"use at most {most}" if most else "not even one fits: shorten the prompts or the answers"
    raise SnapevalError(
        f"{rows} rows of {capacity} slots take {rows * per_row / gib:.1f} GiB ({per_row / gib:.3f} GiB "
        f"each), and {device.type} has {free / gib:.1f} GiB free: {advice}",
        FIELD,
    )
