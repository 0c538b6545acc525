"""A fixed-shape KV cache of ``rows`` independent rows: the decode state of continuous batching.

Every full layer holds keys and values (rows, kv_heads, capacity, head_dim) and the input column of every
slot (rows, kv_heads, capacity; -1 = empty), allocated once; a layer with a sliding window holds
``min(window, capacity)`` slots. A row is loaded from any snapeval cache right after that cache was
prefilled (and so compressed) for one request (:meth:`SlotCache.load_row`): on a full layer its kept
prompt is pinned at the front of the row and the slots after it form the row's ring, as in
:mod:`snapeval.cache.base`. For a cache that grows (``full``, ``snapkv``) the ring is sized to hold every
token the request may generate, so it never wraps and the row equals the growing cache; for a
fixed-capacity cache (``streaming_llm``, ``snapstream``) the ring is the cache's own. A windowed layer's
row is a ring of ``min(window, the row's slots)`` slots taking the cache's ring oldest first.

The per-row cursors (ring start, size, next slot, wraps; one set per window value, full layers' included)
and tokens seen are device tensors, moved by the functions of :mod:`snapeval.cache.ring` that the
single-sequence caches use too. A decode step (:meth:`begin_step`, one model call, :meth:`end_step`,
driven by the batcher's :class:`~snapeval.decode.continuous.classes.RowClasses`, the cache the model is
handed) writes each row's token at its own slot, masks what each row does not hold, and advances the
cursors with tensor operations only: no host synchronisation, no branch on tensor values, no allocation
(but, under ``cache.kv_dtype``, the copies read back), so it compiles to one graph and can be captured as a
CUDA graph. Different prompt lengths, budgets and methods in one batch are just rows with different valid
slots.

All rows of a slot cache store keys and values in one dtype: the model's, or its rows' ``cache.kv_dtype``
(FP8: ``torch.float8_e4m3fn``, scale 1.0, saturated, as :mod:`snapeval.cache.layer` stores them). A step
writes its token's key and value stored so (:func:`~snapeval.cache.layer.to_storage`) and attends every
held slot, its own included, read back in the model's dtype (:meth:`SlotCache.keys_to_attend`,
:meth:`SlotCache.values_to_attend`); a row loads a cache stored in the same dtype, or is refused.

Which slots are valid is the same for every full layer and KV head of a row (every method keeps the same
number of tokens per head, and the ring fills in the same order), so one (rows, capacity) mask serves
them all; :meth:`load_row` checks it. A windowed layer's mask is read per KV head from its slots'
columns (:func:`~snapeval.cache.ring.visible_slots`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import DynamicCache

from snapeval.cache.attention import ROPE_ROTATION, cache_keyword
from snapeval.cache.base import EMPTY, SnapevalCache, histogram_of_kept, stacked
from snapeval.cache.layer import storage_dtype, to_storage
from snapeval.cache.ring import (
    RowRings,
    model_windows,
    oldest_first,
    rows_and_heads,
    visible_slots,
    write_slots,
)
from snapeval.cache.rope import KeyRotation
from snapeval.cache.row_eviction import Reselection, StepRecorder
from snapeval.cache.row_sinks import RowSinks
from snapeval.configs.footprint import kv_element_bytes, layer_slots, row_slots, slot_bytes
from snapeval.errors import SnapevalError


class SlotCache:
    """``rows`` decode rows of ``capacity`` slots per full layer and KV head, filled one request at a time:
    one class of the batcher's rows, whose step :class:`~snapeval.decode.continuous.classes.RowClasses`
    drives (:meth:`begin_step`, then per layer :meth:`write`, :meth:`keys_to_attend`,
    :meth:`attention_mask` and :meth:`record`, then :meth:`end_step`).

    ``rotations`` (per layer, how to turn its RoPE keys) are needed only for rows loaded from a
    StreamingLLM cache with ``rerotate``. Keys are ``key_dim`` wide and values ``value_dim`` (MLA caches a
    latent as keys and the narrower rotary key as values, in one cache head). ``windows``: per layer, its
    sliding window or None; a windowed layer holds ``min(window, capacity)`` slots, with ring cursors of
    its own (those of every layer with that window). Keys and values are stored in ``kv_dtype`` (a
    ``cache.kv_dtype``; None: the model's ``dtype``) and read back in ``dtype``.
    """

    def __init__(
        self,
        rows: int,
        capacity: int,
        layers: int,
        kv_heads: int,
        key_dim: int,
        value_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        rotations: list[KeyRotation | str | None] | None = None,
        windows: list[int | None] | None = None,
        modules: dict[int, torch.nn.Module] | None = None,
        kv_dtype: str | None = None,
    ) -> None:
        self.rows, self.capacity, self.num_layers, self.dtype = rows, capacity, layers, dtype
        self.windows = windows or [None] * layers
        self.rings = {
            window: RowRings(rows, layer_slots(window, capacity), device) for window in self.windows
        }
        self.shapes = CachedShapes(layers, kv_heads, key_dim, value_dim, dtype, tuple(self.windows), kv_dtype)
        shapes = [(rows, kv_heads, self.rings[window].capacity) for window in self.windows]
        stored = self.shapes.stored
        self.keys = [torch.zeros(*shape, key_dim, dtype=stored, device=device) for shape in shapes]
        self.values = [torch.zeros(*shape, value_dim, dtype=stored, device=device) for shape in shapes]
        self.positions = [torch.full(shape, EMPTY, device=device) for shape in shapes]
        self.seen = torch.zeros(rows, dtype=torch.long, device=device)
        self.lead = rows_and_heads(rows, kv_heads, device)  # the row and head indices of every write
        self.sinks = RowSinks(rows, device)  # StreamingLLM's re-rotated sinks
        self.rotations = rotations or [None] * layers  # per layer: how to re-rotate keys, or why not
        self.recorder = StepRecorder(rows, self.windows, modules or {}, device)  # for decode-time eviction

    @classmethod
    def for_model(
        cls, model: torch.nn.Module, rows: int, capacity: int, shapes: CachedShapes | None = None
    ) -> SlotCache:
        """A slot cache shaped for ``model`` (a transformers causal LM with the snapeval attention): its
        rows have the shapes of the tensors the model itself caches and each layer the sliding window its
        attention passes (``shapes``, read by :func:`cached_shapes` if not given), stored in their
        ``kv_dtype``."""
        # a layer's attention module comes after its decoder layer, so it is the one kept per index
        attentions = {m.layer_idx: m for m in model.modules() if hasattr(m, "layer_idx")}
        rotations = [getattr(attentions.get(index), ROPE_ROTATION, None) for index in range(len(attentions))]
        shapes = shapes or cached_shapes(model)
        windows, kv_dtype = list(shapes.windows), shapes.kv_dtype
        return cls(rows, capacity, *shapes[:5], model.device, rotations, windows, attentions, kv_dtype)

    @property
    def ring_wraps(self) -> torch.Tensor:
        """(rows,) times each row's ring came round to its first slot (of its full layers, if any)."""
        return self.rings[None if None in self.rings else self.windows[0]].wraps

    def grown(self, capacity: int) -> SlotCache:
        """A copy with ``capacity`` slots per row (rows keep their slots and cursors): for a request
        larger than any foreseen. New buffers, so a compiled step compiles again."""
        keys, values = self.keys[0], self.values[0]
        bigger = SlotCache(
            self.rows,
            capacity,
            self.num_layers,
            keys.shape[1],
            keys.shape[3],
            values.shape[3],
            self.dtype,
            keys.device,
            self.rotations,
            self.windows,
            kv_dtype=self.shapes.kv_dtype,
        )
        bigger.sinks.copy_from(self.sinks)
        bigger.recorder.copy_from(self.recorder)
        for index in range(self.num_layers):
            held = self.keys[index].shape[2]
            bigger.keys[index][:, :, :held] = self.keys[index]
            bigger.values[index][:, :, :held] = self.values[index]
            bigger.positions[index][..., :held] = self.positions[index]
        for window, rings in self.rings.items():
            bigger.rings[window].copy_from(rings)
        bigger.seen.copy_(self.seen)
        return bigger

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer of the cache (their storage never changes while it lives)."""
        cursors = [tensor for rings in self.rings.values() for tensor in rings.tensors()]
        buffers = [*self.keys, *self.values, *self.positions, *cursors, self.seen, *self.sinks.tensors()]
        return [*buffers, *self.recorder.tensors()]

    # --- filling a row ---------------------------------------------------------------------------
    def load_row(self, row: int, cache: SnapevalCache, new_tokens: int) -> int:
        """Copy a prefilled single-request ``cache`` into ``row``; returns the row's slots (those of a full
        layer).

        A growing cache gets a ring of ``new_tokens`` slots (every token the request may still add); a
        fixed-capacity cache keeps its capacity, ring and cursor. A sliding-window layer takes its ring,
        oldest first, into ``min(window, the row's slots)`` slots.
        """
        first = cache.layers[0]
        slots = first.held if first.fixed else first.held + new_tokens
        if slots > self.capacity:
            raise SnapevalError(f"a request needs {slots} slots; this slot cache has {self.capacity}")
        loaded = {}
        for index, layer in enumerate(cache.layers):
            window = self.windows[index]
            if layer.keys.shape[0] != 1 or layer.window != window:
                raise SnapevalError("a slot row takes one request prefilled by this model")
            if layer.keys.dtype != self.keys[index].dtype:
                stored = f"{self.keys[index].dtype}; its cache, {layer.keys.dtype}"
                raise SnapevalError(f"a slot row stores keys in {stored}", "cache.kv_dtype")
            if window is None:
                cursor = (layer.ring_start, layer.ring_next) if layer.fixed else (layer.held, 0)
                held, order = layer.keys.shape[2], slice(None)
            else:
                cursor, held = (0, 0), layer_slots(window, slots)
                order = oldest_first(layer.ring_next, layer.capacity, layer.keys.device)[-held:]
            valid = layer.positions[0, :, order] >= 0
            group = loaded.setdefault(window, (cursor, valid[0]))
            alike = (
                group[0] == cursor and torch.equal(group[1], valid[0]) and bool((valid == valid[:1]).all())
            )
            if window is None and not alike:  # a window's mask reads each head's slots
                raise SnapevalError("a slot row takes one request whose layers and heads keep alike")
            self.keys[index][row, :, :held] = layer.keys[0, :, order]
            self.values[index][row, :, :held] = layer.values[0, :, order]
            self.positions[index][row] = EMPTY
            self.positions[index][row, :, :held] = layer.positions[0, :, order]
        for window, ((start, next_), valid) in loaded.items():
            rings, size = self.rings[window], layer_slots(window, slots)
            rings.valid[row] = False
            rings.valid[row, : valid.shape[0]] = valid
            rings.start[row], rings.size[row], rings.next[row] = start, size - start, next_
            rings.wraps[row] = 0
        self.seen[row] = first.seen
        self.recorder.fed[row] = 0
        rerotate = getattr(cache, "rerotate", False) and any(layer.ring_start > 0 for layer in cache.layers)
        if rerotate:
            self.admit(cache)
        self.sinks.load(row, cache, rerotate)
        return slots

    # --- one decode step -------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Choose each row's slot for the token about to be fed and mark it valid."""
        for rings in self.rings.values():
            rings.begin_step()

    def admit(self, cache: SnapevalCache, prompt_length: int = 0) -> None:
        """Prepare the step for rows loaded from ``cache`` (after a prompt of ``prompt_length``): one that
        re-rotates keys is refused in one line (naming the family) where the model's keys cannot be
        re-rotated; one that evicts while decoding has the step record what it scores from."""
        eviction = cache.decode_eviction(prompt_length)
        if eviction is not None:
            self.recorder.prepare(eviction, self.dtype)
        if getattr(cache, "rerotate", False):  # StreamingLLM's: sinks turned to their place in the cache
            for rotation in self.rotations:
                if not isinstance(rotation, KeyRotation):
                    why = rotation or "re-rotating keys needs an installed model"
                    raise SnapevalError(why, "cache.rerotate")
            self.sinks.prepare(cache.sinks, self.keys, self.dtype)

    def attention_mask(self, layer_idx: int, num_heads: int, window: int | None = None) -> torch.Tensor:
        """The step's mask of ``layer_idx``, once its token is written: the slots each row holds (rows, 1,
        1, slots: a view of the cursors' valid slots), or on a layer with a sliding ``window`` the rule of
        :func:`~snapeval.cache.ring.visible_slots` per KV head (rows, num_heads, 1, slots)."""
        if window is None:
            return self.rings[self.windows[layer_idx]].valid[:, None, None, :]
        visible = visible_slots(self.positions[layer_idx], self.seen[:, None], window)
        return visible.repeat_interleave(num_heads // visible.shape[1], dim=1)

    def write(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int) -> None:
        """Write the step's key and value of every row, stored in the rows' dtype, at the row's slot of
        ``layer_idx``."""
        keys, values, positions = self.keys[layer_idx], self.values[layer_idx], self.positions[layer_idx]
        rings = self.rings[self.windows[layer_idx]]
        rows, heads = keys.shape[:2]
        columns = self.seen[:, None, None].expand(rows, heads, 1)
        states = (to_storage(key_states, keys.dtype), to_storage(value_states, values.dtype), columns)
        write_slots((keys, values, positions), rings.slot[:, None], states, self.lead)

    def keys_to_attend(self, layer_idx: int) -> torch.Tensor:
        """The held keys of ``layer_idx`` in the model's dtype, a re-rotating row's sinks turned to their
        place in the row (in the keys read back: in the buffer itself where it is in the model's dtype)."""
        keys = self.keys[layer_idx].to(self.dtype)
        if self.sinks.any and self.windows[layer_idx] is None:  # written in place: a few slots per row
            rings, rotation = self.rings[None], self.rotations[layer_idx]
            self.sinks.turn(layer_idx, keys, self.positions[layer_idx], rings, rotation)
        return keys

    def values_to_attend(self, layer_idx: int) -> torch.Tensor:
        """The held values of ``layer_idx`` in the model's dtype."""
        return self.values[layer_idx].to(self.dtype)

    @property
    def wants_layer_inputs(self) -> bool:
        """Whether the step hands the attention its module's inputs (a row's method scores from them)."""
        return self.recorder.wants_layer_inputs

    def record(self, layer_idx: int, query: torch.Tensor, module: torch.nn.Module, inputs) -> None:
        """After a step's attention of ``layer_idx``: note what a row's method re-selects from."""
        if self.recorder.active:
            self.recorder.record(layer_idx, query, inputs)

    def end_step(self) -> None:
        """Advance every row's cursors past the token just written."""
        for rings in self.rings.values():
            rings.end_step()
        self.seen.add_(1)
        self.recorder.end_step()

    def reselect_row(self, row: int, due: Reselection) -> int:
        """Re-select ``row`` in place, between steps (see :meth:`StepRecorder.reselect_row`); returns the
        tokens it holds."""
        buffers = (self.keys, self.values, self.positions)
        return self.recorder.reselect_row(buffers, self.rings[None], row, due, self.dtype)

    # --- what a row holds ------------------------------------------------------------------------
    def row_positions(self, row: int) -> torch.Tensor:
        """(layers, kv_heads, capacity) input column of every slot of ``row`` (-1: empty)."""
        return stacked([positions[row] for positions in self.positions])

    def kept_histogram(self, row: int, prompt_length: int, bins: int = 10) -> dict[str, list[float]]:
        """Share of the row's prompt still held per bin of relative position (see the base cache)."""
        return histogram_of_kept(self.row_positions(row)[:, None], prompt_length, bins)

    def kept_share(self, row: int, end: int, start: int = 0) -> float:
        """Share of the row's tokens at columns [``start``, ``end``) it holds (its prompt's, by default),
        averaged over layers and KV heads."""
        positions = self.row_positions(row)
        held = ((positions >= start) & (positions < end)).sum().item()
        return held / (positions.shape[0] * positions.shape[1] * (end - start))


class CachedShapes(NamedTuple):
    """What a model caches per token (:func:`cached_shapes`): in each of ``layers`` layers ``kv_heads`` heads
    of keys and values of ``dtype``; each layer's sliding window in ``windows`` (None: a full layer); and
    what rows store them in, ``kv_dtype`` (a ``cache.kv_dtype``; None: ``dtype``)."""

    layers: int
    kv_heads: int
    key_dim: int
    value_dim: int
    dtype: torch.dtype
    windows: tuple[int | None, ...]
    kv_dtype: str | None = None

    @property
    def stored(self) -> torch.dtype:
        """The torch dtype rows store keys and values in."""
        return storage_dtype(self.kv_dtype) or self.dtype

    def kv_bytes(self, slots: int) -> int:
        """Bytes of keys and values a row of ``slots`` holds (a windowed layer ``min(window, slots)``), as
        stored: what the batcher's check counts and a result stores (:mod:`snapeval.configs.footprint`)."""
        element = kv_element_bytes(self.kv_dtype, self.dtype.itemsize)
        per_slot = slot_bytes(self.kv_heads, self.key_dim, self.value_dim, element)
        return row_slots(slots, self.windows) * per_slot


@torch.no_grad()
def cached_shapes(model: torch.nn.Module) -> CachedShapes:
    """What ``model`` caches per token, read off the tensors it hands a cache in a one-token forward: most
    models (layers, num_key_value_heads, head_dim, head_dim), MLA one head of ``kv_lora_rank`` wide keys and
    ``qk_rope_head_dim`` wide values; and each layer's window (:func:`~snapeval.cache.ring.model_windows`)."""
    probe = DynamicCache()
    ids = torch.zeros(1, 1, dtype=torch.long, device=model.device)
    model(input_ids=ids, **{cache_keyword(model): probe})
    keys, values = probe.layers[0].keys, probe.layers[0].values
    if any(layer.keys.shape != keys.shape or layer.values.shape != values.shape for layer in probe.layers):
        raise SnapevalError("a slot cache needs a model whose layers all cache alike", "model")
    windows = tuple(model_windows(model))
    return CachedShapes(len(probe.layers), keys.shape[1], keys.shape[3], values.shape[3], keys.dtype, windows)
