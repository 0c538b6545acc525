"""A fixed-shape KV cache of ``rows`` independent rows: the decode state of continuous batching.

Every layer holds keys and values (rows, kv_heads, capacity, head_dim) and the input column of every
slot (rows, kv_heads, capacity; -1 = empty), allocated once. A row is loaded from any snapeval cache
right after that cache was prefilled (and so compressed) for one request (:meth:`SlotCache.load_row`):
its kept prompt is pinned at the front of the row and the slots after it form the row's ring, as in
:mod:`snapeval.cache.base`. For a cache that grows (``full``, ``snapkv``) the ring is sized to hold every
token the request may generate, so it never wraps and the row equals the growing cache; for a
fixed-capacity cache (``streaming_llm``, ``snapstream``) the ring is the cache's own.

The per-row cursors (ring start, size, next slot, tokens seen, wraps) are device tensors. A decode step
(:meth:`begin_step`, one model call, :meth:`end_step`) writes each row's token at its own slot, masks
what each row does not hold, and advances the cursors with tensor operations only: no host
synchronisation, no branch on tensor values, no allocation, so it compiles to one graph and can be
captured as a CUDA graph. Different prompt lengths, budgets and methods in one batch are just rows
with different valid slots.

Which slots are valid is the same for every layer and KV head of a row (every method keeps the same
number of tokens per head, and the ring fills in the same order), so one (rows, capacity) mask serves
the whole model; :meth:`load_row` checks it.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from snapeval.cache.attention import ROPE_ROTATION
from snapeval.cache.base import EMPTY, SnapevalCache, histogram_of_kept, visible_slots
from snapeval.cache.rope import KeyRotation
from snapeval.errors import SnapevalError


def rerotates(cache: SnapevalCache) -> bool:
    """Whether ``cache`` turns its sink keys to their positions inside the cache (StreamingLLM's
    ``rerotate``)."""
    return bool(getattr(cache, "rerotate", False))


class SlotCache:
    """``rows`` decode rows of ``capacity`` slots per layer and KV head, filled one request at a time.

    Pass it as ``past_key_values`` together with ``attention_mask=cache.mask()`` and
    ``position_ids=cache.seen[:, None]``, one token per row, between :meth:`begin_step` and
    :meth:`end_step`. ``rotations`` (per layer, how to turn its RoPE keys) are needed only for rows loaded
    from a StreamingLLM cache with ``rerotate``. Keys are ``key_dim`` wide and values ``value_dim`` (MLA
    caches a latent as keys and the narrower rotary key as values, in one cache head).
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
    ) -> None:
        self.rows, self.capacity, self.num_layers = rows, capacity, layers
        shape = (rows, kv_heads, capacity)
        self.keys = [torch.zeros(*shape, key_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(*shape, value_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.positions = [torch.full(shape, EMPTY, device=device) for _ in range(layers)]
        self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
        self.ring_start = torch.zeros(rows, dtype=torch.long, device=device)
        self.ring_size = torch.ones(rows, dtype=torch.long, device=device)  # an unused row: a 1-slot ring
        self.ring_next = torch.zeros(rows, dtype=torch.long, device=device)
        self.seen = torch.zeros(rows, dtype=torch.long, device=device)
        self.wraps = torch.zeros(rows, dtype=torch.long, device=device)
        self.rerotate = torch.zeros(rows, dtype=torch.bool, device=device)
        self.slot_index = torch.arange(capacity, device=device)
        self._write_slot = torch.zeros(rows, dtype=torch.long, device=device)
        self.rotations = rotations or [None] * layers  # per layer: how to re-rotate keys, or why not
        self.any_rerotate = False  # a Python flag: the rotation is traced only when a row needs it

    @classmethod
    def for_model(cls, model: torch.nn.Module, rows: int, capacity: int) -> SlotCache:
        """A slot cache shaped for ``model`` (a transformers causal LM with the snapeval attention): its
        rows have the shapes of the tensors the model itself caches (:func:`cached_shapes`)."""
        # a layer's attention module comes after its decoder layer, so it is the one kept per index
        attentions = {m.layer_idx: m for m in model.modules() if hasattr(m, ROPE_ROTATION)}
        rotations = [getattr(attentions.get(index), ROPE_ROTATION, None) for index in range(len(attentions))]
        layers, kv_heads, key_dim, value_dim, dtype = cached_shapes(model)
        return cls(rows, capacity, layers, kv_heads, key_dim, value_dim, dtype, model.device, rotations)

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
            keys.dtype,
            keys.device,
        )
        bigger.rotations, bigger.any_rerotate = self.rotations, self.any_rerotate
        for index in range(self.num_layers):
            bigger.keys[index][:, :, : self.capacity] = self.keys[index]
            bigger.values[index][:, :, : self.capacity] = self.values[index]
            bigger.positions[index][..., : self.capacity] = self.positions[index]
        bigger.valid[:, : self.capacity] = self.valid
        for name in ("ring_start", "ring_size", "ring_next", "seen", "wraps", "rerotate"):
            getattr(bigger, name).copy_(getattr(self, name))
        return bigger

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer of the cache (their storage never changes while it lives)."""
        cursors = [self.valid, self.ring_start, self.ring_size, self.ring_next, self.seen, self.wraps]
        return [*self.keys, *self.values, *self.positions, *cursors, self.rerotate, self._write_slot]

    # --- filling a row ---------------------------------------------------------------------------
    def load_row(self, row: int, cache: SnapevalCache, new_tokens: int) -> int:
        """Copy a prefilled single-request ``cache`` into ``row``; returns the row's slots.

        A growing cache gets a ring of ``new_tokens`` slots (every token the request may still add); a
        fixed-capacity cache keeps its capacity, ring and cursor.
        """
        first = cache.layers[0]
        fixed = first.capacity is not None
        held = first.keys.shape[2]
        slots = first.capacity if fixed else held + new_tokens
        if slots > self.capacity:
            raise SnapevalError(f"a request needs {slots} slots; this slot cache has {self.capacity}")
        pattern = first.positions[0] >= 0
        if not (pattern == pattern[:1]).all():
            raise SnapevalError("a slot row takes one request whose layers and heads keep alike")
        for index, layer in enumerate(cache.layers):
            if layer.keys.shape[0] != 1 or not torch.equal(layer.positions[0] >= 0, pattern):
                raise SnapevalError("a slot row takes one request whose layers and heads keep alike")
            self.keys[index][row, :, :held] = layer.keys[0]
            self.values[index][row, :, :held] = layer.values[0]
            self.positions[index][row] = EMPTY
            self.positions[index][row, :, :held] = layer.positions[0]
        self.valid[row] = False
        self.valid[row, :held] = pattern[0]
        ring_start = first.ring_start if fixed else held
        self.ring_start[row] = ring_start
        self.ring_size[row] = slots - ring_start
        self.ring_next[row] = first.ring_next if fixed else 0
        self.seen[row] = first.seen
        self.wraps[row] = 0
        rerotate = rerotates(cache) and ring_start > 0
        self.rerotate[row] = rerotate
        if rerotate:
            self.admit(cache)
        return slots

    # --- one decode step -------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Choose each row's slot for the token about to be fed and mark it valid."""
        torch.add(self.ring_start, self.ring_next, out=self._write_slot)
        self.valid.scatter_(1, self._write_slot[:, None], True)

    def admit(self, cache: SnapevalCache) -> None:
        """Prepare the step for rows loaded from ``cache``: one that re-rotates keys is refused in one line
        (naming the family) where the model's keys cannot be re-rotated."""
        if rerotates(cache):
            for rotation in self.rotations:
                if not isinstance(rotation, KeyRotation):
                    why = rotation or "re-rotating keys needs an installed model"
                    raise SnapevalError(why, "cache.rerotate")
            self.any_rerotate = True

    def mask(self) -> torch.Tensor:
        """(rows, 1, 1, capacity) bool attention mask of the step: the slots each row holds."""
        return self.valid[:, None, None, :]

    owns_decode_mask = True
    """The snapeval attention asks the cache for its decode masks (:meth:`attention_mask`)."""

    def attention_mask(
        self, layer_idx: int, query_length: int, num_heads: int, window: int | None = None
    ) -> torch.Tensor:
        """The step's mask of ``layer_idx``: :meth:`mask`, or on a layer with a sliding ``window`` the
        rule of :func:`~snapeval.cache.base.visible_slots` per KV head (rows, num_heads, 1, capacity)."""
        if window is None:
            return self.mask()
        visible = visible_slots(self.positions[layer_idx], self.seen[:, None], window)
        return visible.repeat_interleave(num_heads // visible.shape[1], dim=1)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """transformers' cache hook: write one token per row, return the keys and values to attend."""
        keys, values, positions = self.keys[layer_idx], self.values[layer_idx], self.positions[layer_idx]
        rows, heads = keys.shape[:2]
        slot = self._write_slot[:, None, None]
        keys.scatter_(2, slot[..., None].expand(rows, heads, 1, keys.shape[3]), key_states)
        values.scatter_(2, slot[..., None].expand(rows, heads, 1, values.shape[3]), value_states)
        positions.scatter_(2, slot.expand(rows, heads, 1), self.seen[:, None, None].expand(rows, heads, 1))
        if self.any_rerotate:
            return self._rerotated(self.rotations[layer_idx], keys, positions), values
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """What transformers < 5.3 asks before a step (for cache positions that our explicit position ids
        and mask make unused): rows differ, so there is no one length; 0."""
        return 0

    def end_step(self) -> None:
        """Advance every row's cursor past the token just written."""
        self.ring_next.add_(1).remainder_(self.ring_size)
        self.wraps.add_((self.ring_next == 0).long())
        self.seen.add_(1)

    def _rerotated(self, rotation: KeyRotation, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Keys with each re-rotating row's sinks turned forward by the tokens evicted after them
        (StreamingLLM's positions inside the cache; see :mod:`snapeval.cache.streaming_llm`)."""
        pinned = (self.slot_index[None, :] < self.ring_start[:, None])[:, None]  # (rows, 1, capacity)
        in_ring = ~pinned & (positions >= 0)
        oldest = positions.masked_fill(~in_ring, torch.iinfo(positions.dtype).max).amin(dim=-1)
        last_sink = positions.masked_fill(~pinned, EMPTY).amax(dim=-1)
        evicted = (oldest - last_sink - 1) * self.rerotate[:, None]
        turned = rotation.rotate(keys, evicted)
        return torch.where((pinned & self.rerotate[:, None, None])[..., None], turned, keys)

    # --- what a row holds ------------------------------------------------------------------------
    def row_positions(self, row: int) -> torch.Tensor:
        """(layers, kv_heads, capacity) input column of every slot of ``row`` (-1: empty)."""
        return torch.stack([positions[row] for positions in self.positions])

    def kept_histogram(self, row: int, prompt_length: int, bins: int = 10) -> dict[str, list[float]]:
        """Share of the row's prompt still held per bin of relative position (see the base cache)."""
        return histogram_of_kept(self.row_positions(row)[:, None], prompt_length, bins)

    def kept_share(self, row: int, prompt_length: int) -> float:
        """Share of the row's prompt tokens it holds, averaged over layers and KV heads."""
        positions = self.row_positions(row)
        held = ((positions >= 0) & (positions < prompt_length)).sum().item()
        return held / (positions.shape[0] * positions.shape[1] * prompt_length)

    def slot_bytes(self) -> int:
        """Bytes of keys and values one slot takes in every layer and KV head."""
        return sum(
            keys[0, :, 0].numel() * keys.element_size() + values[0, :, 0].numel() * values.element_size()
            for keys, values in zip(self.keys, self.values, strict=True)
        )


@torch.no_grad()
def cached_shapes(model: torch.nn.Module) -> tuple[int, int, int, int, torch.dtype]:
    """(layers, kv_heads, key width, value width, dtype) of what ``model`` caches per token, read off the
    tensors it hands a cache in a one-token forward: (layers, num_key_value_heads, head_dim, head_dim) for
    most models; for MLA one head, ``kv_lora_rank`` wide keys and ``qk_rope_head_dim`` wide values."""
    probe = DynamicCache()
    model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=model.device), past_key_values=probe)
    keys, values = probe.layers[0].keys, probe.layers[0].values
    if any(layer.keys.shape != keys.shape or layer.values.shape != values.shape for layer in probe.layers):
        raise SnapevalError("a slot cache needs a model whose layers all cache alike", "model")
    return len(probe.layers), keys.shape[1], keys.shape[3], values.shape[3], keys.dtype
