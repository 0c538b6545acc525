"""The ring of a fixed-capacity layer, shared by single-sequence caches and the batcher's rows.

A fixed-capacity layer's slots after its ``start`` pinned ones form a ring of ``size`` slots whose cursor
``next`` names the slot the next token takes; once the ring is full that slot holds its oldest token. One
set of functions serves :class:`~snapeval.cache.layer.KVLayer` (Python-int cursors, alike for every batch
row) and :class:`~snapeval.cache.slots.SlotCache` (device-tensor cursors, one per row): which slots new
tokens take (:func:`ring_slots`), writing them (:func:`write_slots`), which slots a query sees
(:func:`visible_slots`, the one decode-mask rule), how a sliding-window layer's kept prompt fills its
ring (:func:`window_ring`) and a row takes it (:func:`oldest_first`), and StreamingLLM's re-rotation of
sink keys (:func:`rerotated_sinks`, :func:`evicted_after_sinks`). Tensor operations only, so the batcher's
step compiles.

A layer with a sliding ``window`` holds ``min(window, the method's slots)`` slots
(:func:`snapeval.configs.footprint.layer_slots`), all of them a ring:
query i sees key j iff i - window < j <= i (transformers' rule), so after a prompt of L columns only the
columns after L - window can still be seen; those the method kept fill the ring oldest first, and tokens
leave the ring in the order they leave the window.
"""

from __future__ import annotations

import torch

EMPTY = -1


def ring_slots(start, next_, size, length: int, device: torch.device) -> torch.Tensor:
    """Slots of the next ``length`` tokens: ``start + (next + k) % size`` for k < length. Cursors are ints
    (one ring for every row) or (rows, 1) tensors; the result broadcasts to (rows or 1, length)."""
    return start + (next_ + torch.arange(length, device=device)) % size


def rows_and_heads(rows: int, heads: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The row and head indices of :func:`write_slots`, (rows, 1, 1) and (1, heads, 1): made once by a cache
    that writes every step, so an eager step launches nothing to make them."""
    return torch.arange(rows, device=device)[:, None, None], torch.arange(heads, device=device)[None, :, None]


def write_slots(buffers, slots: torch.Tensor, states, lead: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Write ``states`` (each (rows, heads, n, ...)) into ``buffers`` (keys, values, positions: (rows,
    heads, slots, ...)) at ``slots`` ((rows or 1, n) slot indices); ``lead``: :func:`rows_and_heads` of the
    states, made here if not given.

    An ``index_put_`` at (row, head, slot): under ``torch.compile`` inductor re-inplaces it into a kernel
    that stores the new states only, where a ``scatter_`` becomes an out-of-place scatter plus a copy of
    the whole buffer back (tests/test_slot_writes.py reads the generated code).
    """
    index = (*(lead or rows_and_heads(*states[0].shape[:2], slots.device)), slots[:, None, :])
    for buffer, state in zip(buffers, states, strict=True):
        buffer.index_put_(index, state)


def window_ring(
    kept: torch.Tensor, columns: torch.Tensor, seen: int, window: int, capacity: int
) -> torch.Tensor:
    """(batch, heads, capacity) the prompt slots a sliding-window layer's ring holds after its prompt,
    oldest first and right-aligned (EMPTY before them), so the ring is full and its cursor at slot 0.

    ``kept``: (batch, heads, n) the slots a method kept (EMPTY: none); ``columns``: (batch, heads, L) the
    input column of every prompt slot, ascending (EMPTY: padding); ``seen``: the prompt's length in
    columns. A slot stays if the next query (at column ``seen``) still sees its column j:
    ``seen - window < j``.
    """
    column = columns.gather(-1, kept.clamp(min=0)).masked_fill(kept < 0, EMPTY)
    inside = kept.masked_fill((column < 0) | (column <= seen - window), EMPTY)
    ordered = inside.sort(dim=-1).values  # EMPTY first, then the slots in column order
    if ordered.shape[-1] < capacity:
        ordered = torch.nn.functional.pad(ordered, (capacity - ordered.shape[-1], 0), value=EMPTY)
    return ordered[..., ordered.shape[-1] - capacity :]


def oldest_first(next_: int, size: int, device: torch.device) -> torch.Tensor:
    """(size,) a ring's slots from its oldest token to its newest (the cursor's slot first)."""
    return (next_ + torch.arange(size, device=device)) % size


def evicted_after_sinks(positions: torch.Tensor, pinned: torch.Tensor) -> torch.Tensor:
    """(batch, kv_heads) tokens evicted after the ``pinned`` slots (sinks; a bool tensor broadcasting to
    ``positions``): the gap between the last sink and the oldest ring token."""
    in_ring = ~pinned & (positions >= 0)
    oldest = positions.masked_fill(~in_ring, torch.iinfo(positions.dtype).max).amin(dim=-1)
    last_sink = positions.masked_fill(~pinned, EMPTY).amax(dim=-1)
    return oldest - last_sink - 1


def rerotated_sinks(rotation, keys: torch.Tensor, positions: torch.Tensor, pinned: torch.Tensor):
    """``keys`` with their ``pinned`` slots (sinks) turned forward by the tokens evicted after them
    (StreamingLLM's positions inside the cache; the batcher's rows turn theirs in place:
    :mod:`snapeval.cache.row_sinks`)."""
    turned = rotation.rotate(keys, evicted_after_sinks(positions, pinned))
    return torch.where(pinned[..., None], turned, keys)


def visible_slots(positions: torch.Tensor, queries: torch.Tensor, window: int | None) -> torch.Tensor:
    """(batch, kv_heads, q, slots) bool: which slots each query attends to, the one decode-mask rule of
    every cache (single-sequence layers and the batcher's rows alike).

    ``positions``: (batch, kv_heads, slots) input column of every slot (EMPTY: none); ``queries``:
    (batch or 1, q) the queries' columns. Query i sees slot j iff j is held and j <= i, and on a layer
    with a sliding ``window``, i - window < j too (transformers' sliding-window rule).
    """
    slots, columns = positions[:, :, None, :], queries[:, None, :, None]
    visible = (slots >= 0) & (slots <= columns)
    if window is not None:
        visible &= slots > columns - window
    return visible


def layer_window(module: torch.nn.Module | None) -> int | None:
    """The sliding window transformers passes ``module``'s attention: the module's own ``sliding_window``
    where it has one (Gemma 2/3, GPT-OSS, Qwen2/3: None on full layers), else its config's (Mistral,
    Phi-3)."""
    if module is None:
        return None
    if hasattr(module, "sliding_window"):
        return module.sliding_window
    return getattr(getattr(module, "config", None), "sliding_window", None)


def model_windows(model: torch.nn.Module) -> list[int | None]:
    """Each layer's sliding window (None: a full layer), by layer index (:func:`layer_window`)."""
    # a layer's attention module comes after its decoder layer, so it is the one kept per index
    attentions = {m.layer_idx: m for m in model.modules() if hasattr(m, "layer_idx")}
    return [layer_window(attentions.get(index)) for index in range(len(attentions))]


class RowRings:
    """The batcher's per-row ring cursors of the layers that share one capacity (full layers, or the
    layers with one sliding window), as device tensors, and which of their slots each row holds."""

    def __init__(self, rows: int, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
        self.start = torch.zeros(rows, dtype=torch.long, device=device)
        self.size = torch.ones(rows, dtype=torch.long, device=device)  # an unused row: a 1-slot ring
        self.next = torch.zeros(rows, dtype=torch.long, device=device)
        self.wraps = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot = torch.zeros(rows, dtype=torch.long, device=device)  # where the step's token goes
        self.slot_index = torch.arange(capacity, device=device)
        self.rows = torch.arange(rows, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [self.valid, self.start, self.size, self.next, self.wraps, self.slot]

    def copy_from(self, other: RowRings) -> None:
        self.valid[:, : other.capacity] = other.valid
        for name in ("start", "size", "next", "wraps"):
            getattr(self, name).copy_(getattr(other, name))

    def begin_step(self) -> None:
        cursor = (self.start[:, None], self.next[:, None], self.size[:, None])
        self.slot.copy_(ring_slots(*cursor, 1, self.start.device)[:, 0])
        self.valid[self.rows, self.slot] = True  # an index_put_, re-inplaced under compile

    def end_step(self) -> None:
        self.next.add_(1).remainder_(self.size)
        self.wraps.add_((self.next == 0).long())
