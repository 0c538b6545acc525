"""Per-layer KV storage that remembers where every slot came from.

Every slot of a layer holds one token's key and value for one KV head, plus ``positions``: the column of
that token in the input (its position, for an unpadded prompt), or -1 for an empty or padding slot. From
``positions`` alone the layer derives its attention mask (valid and causally visible slots), reports what it
kept (``kept_positions``), and can be checked against a reference.

A layer is filled in one prefill, compressed right after that prefill's attention (see
:mod:`snapeval.cache.attention`), and then either grows by appending (``capacity=None``) or is a
fixed-capacity buffer, allocated once, whose slots after the ``pinned`` ones form a ring: a new token takes
the next ring slot, and once the ring is full it overwrites the oldest token there. A chunked prefill
(``cache.prefill_chunk``) fills it chunk by chunk: after each chunk but the last it holds the slots its
method selected, in column order (``chunked``), and the next chunk attends to them and itself under the
mask of their columns; the method's layout is made after the last.

A layer with a sliding window (Mistral, Phi-3, Gemma 2/3 local layers, GPT-OSS) holds exactly its window:
``min(window, the method's slots)`` slots, all a ring (:mod:`snapeval.cache.ring`). The method selects from
the whole prompt by scores of the layer's own windowed attention; the layer keeps, of what it selected,
the columns the next query can still see (the last window - 1), oldest first, and the decode mask
(:func:`~snapeval.cache.ring.visible_slots`) shows query i slot j iff i - window < j <= i. A chunk
appended after prefill attends to the ring and the chunk together and leaves its last tokens in the ring.

What a layer keeps is stored in its method's ``cache.kv_dtype`` (:func:`storage_dtype`; null: the model's
own dtype). FP8 (``fp8_e4m3``) is stored as ``torch.float8_e4m3fn`` with a per-tensor scale of 1.0, what
vLLM and SGLang do with ``--kv-cache-dtype fp8`` and no calibrated scales, saturated to its finite range
(+-448) as vLLM's conversion is (:func:`to_storage`). The prefill attends its own keys and values in the
model's dtype and the method selects from them; the kept slots are then stored, and every later attention
(decode steps, appended chunks, their own new tokens included) reads the stored slots dequantized to the
model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import CacheLayerMixin

from snapeval.cache.eviction import Eviction, Recent
from snapeval.cache.ring import (
    EMPTY,
    ring_slots,
    visible_slots,
    window_ring,
    write_slots,
)
from snapeval.configs.footprint import KV_STORAGE, layer_slots, slot_bytes
from snapeval.errors import SnapevalError


def storage_dtype(kv_dtype: str | None) -> torch.dtype | None:
    """The torch dtype keys and values are stored in under ``cache.kv_dtype`` (None: the model's own)."""
    return None if kv_dtype is None else getattr(torch, KV_STORAGE[kv_dtype])


def to_storage(states: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``states`` as stored in ``dtype``: as they are in their own dtype, else saturated to ``dtype``'s
    finite range (FP8 E4M3: +-448; torch's own cast saturates only from torch 2.12 on, before it made NaN
    of what lies beyond) and cast, a per-tensor scale of 1.0. Tensor operations only (a compiled step
    calls it)."""
    if states.dtype == dtype:
        return states
    largest = torch.finfo(dtype).max
    return states.clamp(-largest, largest).to(dtype)


@dataclass
class Selection:
    """What a layer keeps of its prompt.

    ``pinned``: (batch, kv_heads, P) prompt columns kept for good (EMPTY for an unused slot), or None to
    keep the whole prompt in order. ``ring``: (batch, kv_heads, R0) columns placed oldest-first in the ring.
    ``capacity``: total slots of a fixed-capacity layer, or None for a layer that grows.
    """

    pinned: torch.Tensor | None = None
    ring: torch.Tensor | None = None
    capacity: int | None = None


class KVLayer(CacheLayerMixin):
    """One layer's keys/values (batch, kv_heads, slots, head_dim) with the column of every slot."""

    is_sliding = False

    def __init__(self) -> None:
        super().__init__()
        self.positions: torch.Tensor | None = None
        self.seen = 0
        self.capacity: int | None = None
        self.ring_start = 0
        self.ring_next = 0
        self.window: int | None = None  # the layer's sliding window, once its prompt is kept
        self.fixed = False  # the method holds a fixed number of slots (else it grows)
        self.held = 0  # slots the method holds (on a full layer): its capacity, or what it kept and appended
        self.stored: torch.dtype | None = None  # what its kept keys and values are stored in, once kept
        self.prefilled = False
        self.chunked = False  # holds the selection of a prompt's first chunks; more chunks come
        self._dense = False
        self._attended: torch.Tensor | None = None  # positions of the keys the last update returned
        self.eviction: Eviction | None = None  # how the method re-selects while decoding, if it does
        self.filled = 0  # tokens an evicting layer holds (its slots from the first on)
        self.since = 0  # one-token decode steps since its prefill or its last re-selection
        self.fed = 0  # one-token decode steps since its prefill
        self.recent: dict[str, Recent] = {}  # "queries" / "hidden_states" of its last decode steps

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        batch, heads, length, _ = key_states.shape
        columns = torch.arange(self.seen, self.seen + length, device=key_states.device)
        columns = columns.repeat(batch, heads, 1)
        self._attended = None
        if self.prefilled:  # stored as the layer's slots are, and attended as read back from them
            key_states = to_storage(key_states, self.stored)
            value_states = to_storage(value_states, self.stored)
        if self.prefilled and not self.fixed:
            self.held += length
        if self.prefilled and self.evicts():
            if self.filled + length > self.capacity:
                raise SnapevalError(
                    f"{length} more tokens overflow a row of {self.capacity} slots holding {self.filled}; "
                    "raise the method's buffer",
                    "cache",
                )
            self.filled += length
        if not self.prefilled and not self.chunked:
            if self.keys is not None:
                raise SnapevalError("a snapeval cache takes its prompt in one prefill call")
            self.keys, self.values, self.positions = key_states, value_states, columns
        elif self.capacity is None:
            self.keys = torch.cat([self.keys, key_states], dim=2)
            self.values = torch.cat([self.values, value_states], dim=2)
            self.positions = torch.cat([self.positions, columns], dim=2)
        elif self.window is not None and length > 1:  # a chunk attends to the ring and itself
            new = (key_states, value_states, columns)
            attended = [torch.cat(pair, dim=2) for pair in zip(self._states(), new, strict=True)]
            tail = min(length, self.capacity)
            self._write_ring((key_states[:, :, -tail:], value_states[:, :, -tail:], columns[..., -tail:]))
            self._attended = attended[2]
            self.seen += length
            return attended[0].to(self.dtype), attended[1].to(self.dtype)
        else:
            self._write_ring((key_states, value_states, columns))
        self.seen += length
        return self.keys.to(self.dtype), self.values.to(self.dtype)

    def _states(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.keys, self.values, self.positions

    def _write_ring(self, states: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        length = states[0].shape[2]
        ring_size = self.capacity - self.ring_start
        if length > ring_size:
            raise SnapevalError(
                f"cannot append {length} tokens at once to a ring of {ring_size} slots; feed them in chunks"
            )
        slots = ring_slots(self.ring_start, self.ring_next, ring_size, length, self.keys.device)
        write_slots(self._states(), slots[None], states)
        self.ring_next = (self.ring_next + length) % ring_size

    def keep(
        self,
        valid: torch.Tensor,
        selection: Selection,
        window: int | None = None,
        stored: torch.dtype | None = None,
        final: bool = True,
    ) -> None:
        """Compress the prefilled prompt to ``selection``; padding columns (``~valid``) become EMPTY. A
        layer with a sliding ``window`` keeps the selected columns still inside it, in a ring of
        ``min(window, the method's slots)`` slots (:func:`~snapeval.cache.ring.window_ring`). What it
        keeps is stored in ``stored`` (:func:`to_storage`; None: the model's dtype).

        Before the ``final`` chunk of a chunked prefill the layer holds the selected slots in column order,
        read back as stored, and grows by the next chunk (its method's layout comes after the last)."""
        prompt = (self.keys, self.values, self.positions.masked_fill(~valid[:, None, :], EMPTY))
        self.stored = stored or self.dtype
        self.chunked = not final
        if not final:
            keys, values, self.positions = _gather(*prompt, _in_order(_selected_slots(selection, prompt[2])))
            self.keys, self.values = (to_storage(s, self.stored).to(self.dtype) for s in (keys, values))
            return
        kept = prompt if selection.pinned is None else _gather(*prompt, selection.pinned)
        self.prefilled = True
        self.window = window
        self.fixed = selection.capacity is not None
        self.held = selection.capacity or kept[0].shape[2]
        self.capacity = layer_slots(window, selection.capacity)
        if window is not None:
            slots = _selected_slots(selection, prompt[2])
            ring = window_ring(slots, prompt[2], self.seen, window, self.capacity)
            self._hold(*_gather(*prompt, ring))
            return
        if self.capacity is None:
            self._hold(*kept)
            return
        pinned = kept[0].shape[2]
        self.filled = pinned + (0 if selection.ring is None else selection.ring.shape[-1])
        if pinned >= self.capacity:
            raise SnapevalError(f"{pinned} pinned tokens leave no ring slot in a capacity of {self.capacity}")
        self._allocate(*kept)
        self._write(slice(0, pinned), kept)
        self.ring_start = pinned
        if selection.ring is not None:
            filled = selection.ring.shape[-1]
            self._write(slice(pinned, pinned + filled), _gather(*prompt, selection.ring))
            self.ring_next = filled % (self.capacity - pinned)

    # --- decode-time eviction (snapeval.cache.eviction) ------------------------------------------
    def evicts(self) -> bool:
        """Whether the method re-selects this layer while decoding (a full-attention layer only)."""
        return self.eviction is not None and self.window is None

    def record(self, query: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """Note one decode step: its query (batch, heads, d) and attention input (batch, hidden)."""
        entries = {"queries": query, "hidden_states": hidden}
        sizes = {"queries": self.eviction.queries, "hidden_states": self.eviction.hidden}
        for name, entry in entries.items():
            if entry is not None and sizes[name] > 0:
                if name not in self.recent:
                    shape = tuple(entry.shape[1:])
                    self.recent[name] = Recent(entry.shape[0], sizes[name], shape, entry.dtype, entry.device)
                self.recent[name].write(entry, self.fed)
        self.fed += 1
        self.since += 1

    def recent_entries(self, name: str, row: int = 0) -> torch.Tensor | None:
        """(1, n, ...) the recorded ``name`` entries the method reads, oldest first (hidden states: since
        the last re-selection), or None if none are recorded."""
        if name not in self.recent:
            return None
        return self.recent[name].last(row, self.fed, self.eviction.wanted(name, self.since))

    def held_states(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys, values (read back in the model's dtype) and columns of the slots an evicting layer holds,
        in storage order."""
        return (
            self.keys[:, :, : self.filled].to(self.dtype),
            self.values[:, :, : self.filled].to(self.dtype),
            self.positions[..., : self.filled],
        )

    def take(self, reselected: tuple[tuple[torch.Tensor, ...], int] | None) -> None:
        """After a re-selection: hold its row (its kept slots first; None: unchanged) and write the next
        token after them."""
        if reselected is not None:
            states, kept = reselected
            self._hold(*states)
            self.ring_start, self.ring_next, self.filled = 0, kept, kept
            self._dense = False  # its slots fill up again
        self.since = 0

    def _hold(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Hold these slots, keys and values stored in the layer's dtype."""
        self.keys, self.values = to_storage(keys, self.stored), to_storage(values, self.stored)
        self.positions = positions

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        batch, heads = keys.shape[:2]
        self.keys = keys.new_zeros(batch, heads, self.capacity, keys.shape[-1], dtype=self.stored)
        self.values = values.new_zeros(batch, heads, self.capacity, values.shape[-1], dtype=self.stored)
        self.positions = positions.new_full((batch, heads, self.capacity), EMPTY)

    def _write(self, slots: slice, states: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        keys, values, positions = states
        self.keys[:, :, slots] = to_storage(keys, self.stored)
        self.values[:, :, slots] = to_storage(values, self.stored)
        self.positions[:, :, slots] = positions

    def batch_repeat_interleave(self, repeats: int) -> None:
        """``repeats`` copies of every batch row, in order: one prefill shared by several generations."""
        if self.keys is not None:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)
            self.positions = self.positions.repeat_interleave(repeats, dim=0)

    def attention_mask(
        self, query_length: int, num_heads: int, window: int | None = None
    ) -> torch.Tensor | None:
        """(batch, num_heads, q, slots) bool: the slots :func:`~snapeval.cache.ring.visible_slots` shows
        each query (a layer with a sliding ``window`` sees only inside it); None if all."""
        if query_length == 1 and self._dense and window is None:
            return None
        positions = self.positions if self._attended is None else self._attended
        query_columns = torch.arange(self.seen - query_length, self.seen, device=positions.device)
        visible = visible_slots(positions, query_columns[None], window)
        if query_length == 1 and window is None and self.prefilled and bool(visible.all()):
            self._dense = True  # slots only ever fill up from here on
            return None
        return visible.repeat_interleave(num_heads // visible.shape[1], dim=1)

    def get_mask_sizes(self, query_length: int | torch.Tensor) -> tuple[int, int]:
        # transformers < 5.3 passes the query's cache positions, later versions its length
        length = query_length if isinstance(query_length, int) else query_length.shape[0]
        if self.chunked:  # a chunk attends to the held slots and itself under the layer's own mask
            return self.keys.shape[2] + length, 0
        return self.seen + length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.capacity or -1

    get_max_cache_shape = get_max_length  # its name in transformers < 5.3

    def kv_bytes(self) -> int:
        """Bytes of the keys and values held, as stored: every batch row's slots (:func:`slot_bytes`)."""
        if self.keys is None:
            return 0
        batch, heads, slots, key_dim = self.keys.shape
        return batch * slots * slot_bytes(heads, key_dim, self.values.shape[-1], self.keys.element_size())


def _selected_slots(selection: Selection, positions: torch.Tensor) -> torch.Tensor:
    """(batch, heads, n) the prompt slots ``selection`` keeps (pinned, or all, then its ring's)."""
    pinned = selection.pinned
    if pinned is None:
        pinned = torch.arange(positions.shape[-1], device=positions.device).expand_as(positions)
    return pinned if selection.ring is None else torch.cat([pinned, selection.ring], dim=-1)


def _in_order(slots: torch.Tensor) -> torch.Tensor:
    """``slots`` ascending (a prompt's slots are in column order), EMPTY ones last."""
    last = torch.iinfo(slots.dtype).max
    ordered = slots.masked_fill(slots < 0, last).sort(dim=-1).values
    return ordered.masked_fill(ordered == last, EMPTY)


def _gather(keys, values, positions, columns):
    """Slots at ``columns`` (batch, heads, n) of (keys, values, positions); EMPTY columns stay EMPTY.
    Keys and values may differ in width (MLA caches a latent and a narrower rotary key)."""
    index = columns.clamp(min=0)
    gathered_positions = positions.gather(2, index).masked_fill(columns < 0, EMPTY)
    return _gather_slots(keys, index), _gather_slots(values, index), gathered_positions


def _gather_slots(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return states.gather(2, index[..., None].expand(-1, -1, -1, states.shape[-1]))
