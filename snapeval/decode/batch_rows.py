"""How many decode rows a run gets: ``run.batch_size``, capped by what the run can use (its number
of requests) and refused in one line when the rows would not fit in the memory free on the device.

A row holds ``capacity`` slots in every full layer and KV head and ``min(window, capacity)`` in a layer
with a sliding window: keys, values and their positions (:class:`snapeval.cache.slots.SlotCache`), so its
bytes are its keys and values (:meth:`snapeval.cache.slots.CachedShapes.kv_bytes`, what a result
stores, and the memory estimator's bytes per sequence) plus an 8-byte position per slot and KV head and a
valid flag per ring slot (:func:`row_bytes`), its slots all counted by
:func:`snapeval.configs.footprint.row_slots`.

Under tensor parallel (torchrun) each rank holds its own share of KV heads, so :func:`row_bytes` of its
shapes is a rank's row, and each rank reads its own free memory: the check reads the least free on any
rank (:func:`agreed_free_bytes`), so that every rank refuses or allocates alike, never one rank alone
(which would leave the others waiting in a collective).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from snapeval.cache.slots import CachedShapes
from snapeval.configs.footprint import row_slots
from snapeval.errors import SnapevalError

FIELD = "run.batch_size"
POSITION_BYTES = 8  # an int64 position per slot, layer and KV head
FLAG_BYTES = 1  # a bool valid flag per slot of a ring
MEMINFO = Path("/proc/meminfo")


def usable_rows(batch_size: int, requests: int) -> int:
    """Rows worth allocating: no more than the requests that can be in flight at once."""
    return max(1, min(batch_size, requests))


def row_bytes(capacity: int, shapes: CachedShapes) -> int:
    """Bytes of one row of ``capacity`` slots (on a full layer; a layer with a sliding window holds
    ``min(window, capacity)``) for a model caching ``shapes`` (:func:`snapeval.cache.slots.cached_shapes`):
    its keys and values as the rows store them (:meth:`~snapeval.cache.slots.CachedShapes.kv_bytes`: 1
    byte an element under ``cache.kv_dtype=fp8_e4m3``), an int64 position per slot and KV head, and a
    valid flag per slot of each distinct window's ring."""
    positions = row_slots(capacity, shapes.windows) * shapes.kv_heads * POSITION_BYTES
    flags = row_slots(capacity, set(shapes.windows)) * FLAG_BYTES
    return shapes.kv_bytes(capacity) + positions + flags


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


def agreed_free_bytes(device: torch.device) -> int | None:
    """The least memory free (:func:`free_bytes`) on any rank of the process group, ``device`` being this
    rank's (one all-reduce on it); this rank's own figure outside a process group of more than one. A rank
    that cannot tell leaves the others' figure; None where no rank can tell."""
    free = free_bytes(device)
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() <= 1:
        return free
    unknown = torch.iinfo(torch.int64).max
    least = torch.tensor([unknown if free is None else free], dtype=torch.int64, device=device)
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    agreed = int(least.item())
    return None if agreed == unknown else agreed


def check_rows_fit(plan: Sequence[tuple[int, int]], shapes: CachedShapes, device: torch.device) -> None:
    """Refuse rows in ``plan`` (capacity, rows per class of rows) of a model caching ``shapes`` that the
    memory free on ``device`` cannot hold (:func:`row_bytes`); under tensor parallel, the least free on
    any rank (:func:`agreed_free_bytes`), so that every rank decides alike."""
    rows = sum(count for _, count in plan)
    total = sum(count * row_bytes(capacity, shapes) for capacity, count in plan)
    free = agreed_free_bytes(device)
    if free is None or total <= free:
        return
    gib, per_row = 2**30, total / rows
    most = int(free // per_row)
    advice = f"use at most {most}" if most else "not even one fits: shorten the prompts or the answers"
    sizes = " + ".join(f"{count} of {capacity} slots" for capacity, count in reversed(plan))
    described = f"{rows} rows of {plan[0][0]} slots" if len(plan) == 1 else f"{rows} rows ({sizes})"
    raise SnapevalError(
        f"{described} take {total / gib:.1f} GiB ({per_row / gib:.3f} GiB each), and {device.type} has "
        f"{free / gib:.1f} GiB free: {advice}",
        FIELD,
    )
