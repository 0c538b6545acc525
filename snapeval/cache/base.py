"""Per-layer KV storage that remembers where every slot came from, and the base class of all caches.

Every slot of a layer holds one token's key and value for one KV head, plus ``positions``: the column of
that token in the input (its position, for an unpadded prompt), or -1 for an empty or padding slot. From
``positions`` alone the layer derives its attention mask (valid and causally visible slots), reports what it
kept (``kept_positions``), and can be checked against a reference.

A layer is filled in one prefill, compressed right after that prefill's attention (see
:mod:`snapeval.cache.attention`), and then either grows by appending (``capacity=None``) or is a
fixed-capacity buffer, allocated once, whose slots after the ``pinned`` ones form a ring: a new token takes
the next ring slot, and once the ring is full it overwrites the oldest token there.

A layer with a sliding window (Mistral, Phi-3, Gemma 2/3 local layers, GPT-OSS) holds exactly its window:
``min(window, the method's slots)`` slots, all a ring (:mod:`snapeval.cache.ring`). The method selects from
the whole prompt by scores of the layer's own windowed attention; the layer keeps, of what it selected,
the columns the next query can still see (the last window - 1), oldest first, and the decode mask
(:func:`~snapeval.cache.ring.visible_slots`) shows query i slot j iff i - window < j <= i. A chunk
appended after prefill attends to the ring and the chunk together and leaves its last tokens in the ring.
"""

from __future__ import annotations

import inspect
import math
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from snapeval.cache.mla import is_latent, latent_keys, latent_queries
from snapeval.cache.ring import (
    EMPTY,
    ring_slots,
    visible_slots,
    window_capacity,
    window_ring,
    write_slots,
)
from snapeval.errors import SnapevalError

LAYER_WINDOW = "snapeval_sliding_window"  # an attention module's sliding window, as its prefill passed it


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


@dataclass
class LayerPrompt:
    """One layer's prompt at the end of prefill, as every method selects from it.

    ``keys``: (batch, kv_heads, L, head_dim) post-RoPE keys as the layer caches them (for MLA: the latent,
    one cache head, with the rotary key as ``values``); ``query``: (batch, heads, L, head_dim) post-RoPE
    queries as the attention function received them; ``valid``: (batch, L) real (non-padding) columns;
    ``scaling``: the attention scale.
    ``scores``: where scoring keeps what several selections from one prefill share (see
    :mod:`snapeval.cache.scoring`); a prompt is never changed in place. ``values``, the attention
    ``module`` and its forward's keyword ``inputs`` (``hidden_states``, ``position_embeddings``, ...) are
    there for methods that score from them (``inputs`` only for a cache with ``wants_layer_inputs``).
    """

    keys: torch.Tensor
    query: torch.Tensor
    valid: torch.Tensor
    scaling: float
    scores: dict = field(default_factory=dict)
    values: torch.Tensor | None = None
    module: torch.nn.Module | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return self.keys.shape[2]

    @property
    def sliding_window(self) -> int | None:
        """The layer's sliding window (None: a full-attention layer): its scores see only inside it."""
        return getattr(self.module, LAYER_WINDOW, None)

    @property
    def cache_heads(self) -> int:
        """Heads the layer's cache holds, each selected for on its own: its KV heads (MLA: one latent)."""
        return self.keys.shape[1]

    def scoring_keys(self) -> torch.Tensor:
        """(batch, cache_heads, L, d) the keys queries are scored against: the cached keys, or for MLA the
        latent keys ``[c, k_rot]`` (see :mod:`snapeval.cache.mla`)."""
        if is_latent(self.module):
            return latent_keys(self.keys, self.values)
        return self.keys

    def window_queries(self, window: int) -> torch.Tensor:
        """(batch, heads, window, d) the last ``window`` queries, in the space of :meth:`scoring_keys`."""
        query = self.query[:, :, -window:]
        return latent_queries(self.module, query) if is_latent(self.module) else query


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
        self.prefilled = False
        self._dense = False
        self._attended: torch.Tensor | None = None  # positions of the keys the last update returned

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
        if self.prefilled and not self.fixed:
            self.held += length
        if not self.prefilled:
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
            return attended[0], attended[1]
        else:
            self._write_ring((key_states, value_states, columns))
        self.seen += length
        return self.keys, self.values

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

    def keep(self, valid: torch.Tensor, selection: Selection, window: int | None = None) -> None:
        """Compress the prefilled prompt to ``selection``; padding columns (``~valid``) become EMPTY. A
        layer with a sliding ``window`` keeps the selected columns still inside it, in a ring of
        ``min(window, the method's slots)`` slots (:func:`~snapeval.cache.ring.window_ring`)."""
        prompt = (self.keys, self.values, self.positions.masked_fill(~valid[:, None, :], EMPTY))
        kept = prompt if selection.pinned is None else _gather(*prompt, selection.pinned)
        self.prefilled = True
        self.window = window
        self.fixed = selection.capacity is not None
        self.held = selection.capacity or kept[0].shape[2]
        self.capacity = window_capacity(window, selection.capacity)
        if window is not None:
            columns = kept[2] if selection.ring is None else torch.cat([kept[2], selection.ring], dim=-1)
            ring = window_ring(columns, self.seen, window, self.capacity)
            self.keys, self.values, self.positions = _gather(*prompt, ring)
            return
        if self.capacity is None:
            self.keys, self.values, self.positions = kept
            return
        pinned = kept[0].shape[2]
        if pinned >= self.capacity:
            raise SnapevalError(f"{pinned} pinned tokens leave no ring slot in a capacity of {self.capacity}")
        self._allocate(*kept)
        self._write(slice(0, pinned), kept)
        self.ring_start = pinned
        if selection.ring is not None:
            filled = selection.ring.shape[-1]
            self._write(slice(pinned, pinned + filled), _gather(*prompt, selection.ring))
            self.ring_next = filled % (self.capacity - pinned)

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        batch, heads = keys.shape[:2]
        self.keys = keys.new_zeros(batch, heads, self.capacity, keys.shape[-1])
        self.values = values.new_zeros(batch, heads, self.capacity, values.shape[-1])
        self.positions = positions.new_full((batch, heads, self.capacity), EMPTY)

    def _write(self, slots: slice, states: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        self.keys[:, :, slots], self.values[:, :, slots], self.positions[:, :, slots] = states

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
        if query_length == 1 and window is None and bool(visible.all()):
            self._dense = True  # slots only ever fill up from here on
            return None
        return visible.repeat_interleave(num_heads // visible.shape[1], dim=1)

    def get_mask_sizes(self, query_length: int | torch.Tensor) -> tuple[int, int]:
        # transformers < 5.3 passes the query's cache positions, later versions its length
        length = query_length if isinstance(query_length, int) else query_length.shape[0]
        return self.seen + length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.capacity or -1

    get_max_cache_shape = get_max_length  # its name in transformers < 5.3

    def kv_bytes(self) -> int:
        if self.keys is None:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


def _gather(keys, values, positions, columns):
    """Slots at ``columns`` (batch, heads, n) of (keys, values, positions); EMPTY columns stay EMPTY.
    Keys and values may differ in width (MLA caches a latent and a narrower rotary key)."""
    index = columns.clamp(min=0)
    gathered_positions = positions.gather(2, index).masked_fill(columns < 0, EMPTY)
    return _gather_slots(keys, index), _gather_slots(values, index), gathered_positions


def _gather_slots(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return states.gather(2, index[..., None].expand(-1, -1, -1, states.shape[-1]))


class SnapevalCache(Cache):
    """Base of every snapeval cache. A subclass states its algorithm in :meth:`select`.

    Use it like any transformers cache: ``model.generate(ids, past_key_values=SnapStreamCache(budget=1024))``
    on a model prepared with :func:`snapeval.cache.install`. A cache object serves one generation.
    """

    method: str = "base"
    """The name in configs and results."""
    label: str = ""
    """The name in figures (the ``method`` if empty)."""
    wants_layer_inputs = False
    """True for a method that scores from an attention module's forward inputs (:class:`LayerPrompt`)."""
    selects_before_prefill = False
    """True for a method that chooses which prompt tokens to prefill (:meth:`prefill_input`): its prefill
    is its own, never shared with other settings."""
    owns_decode_mask = True
    """The snapeval attention asks the cache for its decode masks (:meth:`attention_mask`)."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=KVLayer)

    @abstractmethod
    def select(self, prompt: LayerPrompt) -> Selection:
        """Choose what a layer keeps of its ``prompt``."""

    @classmethod
    def parameter_names(cls) -> list[str]:
        """The method's parameters: its constructor's arguments, each kept as an attribute of that name."""
        return list(inspect.signature(cls.__init__).parameters)[1:]

    def params(self) -> dict:
        """The method and its parameters, as stored with results."""
        return {"method": self.method, **{name: getattr(self, name) for name in self.parameter_names()}}

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        """Slots one row needs at a fixed shape: ``prompt_length`` compressed prompt tokens, then
        ``new_tokens`` appended (a query after the compressed part, and every token generated)."""
        return prompt_length + new_tokens

    def prefill_input(
        self, model: torch.nn.Module, prompt_ids: list[int]
    ) -> tuple[list[int], list[int] | None]:
        """The tokens to prefill for ``prompt_ids`` and their positions in it (None: all, in order)."""
        return list(prompt_ids), None

    def awaiting_prefill(self, layer_idx: int) -> bool:
        return not self.layers[layer_idx].prefilled

    def finish_prefill(self, layer_idx: int, *args, **kwargs) -> None:
        """Compress ``layer_idx`` right after its prefill attention (arguments: :meth:`layer_prompt`'s)."""
        prompt = self.layer_prompt(layer_idx, *args, **kwargs)
        self.layers[layer_idx].keep(prompt.valid, self.select(prompt), prompt.sliding_window)

    def layer_prompt(
        self,
        layer_idx: int,
        query: torch.Tensor,
        valid: torch.Tensor,
        scaling: float,
        module: torch.nn.Module | None = None,
        inputs: Mapping[str, Any] | None = None,
    ) -> LayerPrompt:
        """Layer ``layer_idx``'s prompt as its prefill left it, for :meth:`select`."""
        layer = self.layers[layer_idx]
        return LayerPrompt(
            layer.keys, query, valid, scaling, values=layer.values, module=module, inputs=inputs or {}
        )

    def fill_layer(self, layer_idx: int, prompt: LayerPrompt, values: torch.Tensor) -> None:
        """Prefill and compress ``layer_idx`` from a prefill computed elsewhere (a shared one, see
        :class:`~snapeval.cache.grid.CacheGrid`): exactly what this cache's own prefill would hold."""
        while len(self.layers) <= layer_idx:
            self.layers.append(KVLayer())
        layer = self.layers[layer_idx]
        layer.update(prompt.keys, values)
        layer.keep(prompt.valid, self.select(prompt), prompt.sliding_window)

    def attention_mask(
        self, layer_idx: int, query_length: int, num_heads: int, window: int | None = None
    ) -> torch.Tensor | None:
        """The decode mask of ``layer_idx`` (``window``: the layer's sliding window, if it has one)."""
        return self.layers[layer_idx].attention_mask(query_length, num_heads, window)

    def attention_keys(self, layer_idx: int, key: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
        """The keys a decode step of ``layer_idx`` attends to: the cached ``key`` itself, by default."""
        return key

    def kept_positions(self, layer_idx: int) -> torch.Tensor:
        """(batch, kv_heads, slots) input column of every slot of a layer; -1 marks an empty slot."""
        return self.layers[layer_idx].positions

    def append_limit(self) -> int | None:
        """Most tokens one forward call may append after prefill (a ring's size), or None: no limit."""
        rings = [
            layer.capacity - layer.ring_start
            for layer in self.layers
            if layer.capacity is not None and layer.window is None  # a window's ring takes any chunk
        ]
        return min(rings) if rings else None

    def kept_histogram(
        self, prompt_length: int, bins: int = 10, row: int | None = None, padding: int = 0
    ) -> dict[str, list[float]]:
        """Share of the prompt's tokens still held, per bin of relative prompt position, averaged over
        layers, KV heads and batch rows (or one ``row``, whose prompt starts after ``padding`` columns):
        which parts of the prompt survive compression."""
        positions = stacked([layer.positions for layer in self.layers])
        if row is not None:
            positions = positions[:, row : row + 1]
        positions = torch.where(positions >= padding, positions - padding, EMPTY)
        return histogram_of_kept(positions, prompt_length, bins)

    def kv_bytes(self) -> int:
        """Bytes of keys and values held, all layers."""
        return sum(layer.kv_bytes() for layer in self.layers)


def stacked(positions: list[torch.Tensor]) -> torch.Tensor:
    """Layers' slot columns stacked along a new first dimension, each padded with EMPTY slots to the widest
    (a sliding-window layer holds fewer slots than a full one)."""
    width = max(layer.shape[-1] for layer in positions)
    pad = torch.nn.functional.pad
    return torch.stack([pad(layer, (0, width - layer.shape[-1]), value=EMPTY) for layer in positions])


def histogram_of_kept(positions: torch.Tensor, prompt_length: int, bins: int = 10) -> dict[str, list[float]]:
    """Share of a prompt's tokens held in ``positions`` (layers, batch, kv_heads, slots), per bin of
    relative prompt position, averaged over layers, batch rows and KV heads."""
    prompt = positions[(positions >= 0) & (positions < prompt_length)].float()
    edges = torch.linspace(0, prompt_length, bins + 1)
    counts = torch.histogram(prompt.cpu(), bins=edges).hist
    per_bin = torch.histogram(torch.arange(prompt_length, dtype=torch.float32), bins=edges).hist
    share = counts / (per_bin.clamp(min=1) * positions[..., 0].numel())
    return {"bins": (edges / prompt_length).tolist(), "counts": share.tolist()}


def resolve_budget(budget: int | None, ratio: float | None, prompt_length: int, minimum: int) -> int:
    """Slots for a prompt: ``budget`` as given, or ``ceil(ratio * prompt_length)`` (at least ``minimum``)."""
    if budget is not None:
        return budget
    return max(minimum, math.ceil(ratio * prompt_length))
