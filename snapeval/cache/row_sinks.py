"""StreamingLLM's re-rotated sinks in the batcher's rows, turned in place.

A row loaded from a StreamingLLM cache with ``rerotate`` attends its sink keys turned forward by the
tokens evicted after them (:func:`~snapeval.cache.ring.evicted_after_sinks`), as the single cache does
(:func:`~snapeval.cache.ring.rerotated_sinks`). The sinks' keys as they were cached are kept here; each
step turns them and writes them over the row's sink slots of the full layers: a few slots per row, never
the whole key buffer. A sliding-window layer pins no sinks.
"""

from __future__ import annotations

import torch

from snapeval.cache.base import SnapevalCache
from snapeval.cache.ring import RowRings, evicted_after_sinks, write_slots
from snapeval.cache.rope import KeyRotation


class RowSinks:
    """Which of ``rows`` rows re-rotate their sinks, and their sink keys as cached, per layer."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.rerotate = torch.zeros(rows, dtype=torch.bool, device=device)
        self.keys: list[torch.Tensor] = []  # per layer (rows, kv_heads, sinks, key_dim)
        self.any = False  # a Python flag: the turn is traced only when a row needs it

    def tensors(self) -> list[torch.Tensor]:
        return [self.rerotate, *self.keys]

    def prepare(self, sinks: int, like: list[torch.Tensor], dtype: torch.dtype) -> None:
        """Room for ``sinks`` sink keys per row in each layer (``like``: the layers' key buffers), read back
        in ``dtype`` (the model's); new buffers only when more sinks than ever are asked for."""
        self.any = True
        if self.keys and self.keys[0].shape[2] >= sinks:
            return
        shapes = [(*key.shape[:2], sinks, key.shape[3]) for key in like]
        old, self.keys = self.keys, [like[0].new_zeros(shape, dtype=dtype) for shape in shapes]
        for new, kept in zip(self.keys, old, strict=False):
            new[:, :, : kept.shape[2]] = kept

    def copy_from(self, other: RowSinks) -> None:
        self.rerotate.copy_(other.rerotate)
        self.keys = [key.clone() for key in other.keys]
        self.any = other.any

    def load(self, row: int, cache: SnapevalCache, rerotate: bool) -> None:
        """Row ``row`` now holds ``cache``: keep its sinks' keys if it re-rotates them."""
        self.rerotate[row] = rerotate
        if rerotate:
            for keys, layer in zip(self.keys, cache.layers, strict=True):
                keys[row, :, : layer.ring_start] = layer.keys[0, :, : layer.ring_start]

    def turn(
        self,
        layer_idx: int,
        keys: torch.Tensor,
        positions: torch.Tensor,
        rings: RowRings,
        rotation: KeyRotation,
    ) -> None:
        """Write the re-rotating rows' sinks of full layer ``layer_idx`` into ``keys``, turned forward by
        the tokens evicted after them (``rotation``: the layer's, checked when the rows were admitted)."""
        sinks = self.keys[layer_idx]
        count = sinks.shape[2]
        pinned = (rings.slot_index[None, :] < rings.start[:, None])[:, None]  # (rows, 1, slots)
        evicted = evicted_after_sinks(positions, pinned) * self.rerotate[:, None]
        turning = (pinned[..., :count] & self.rerotate[:, None, None])[..., None]
        turned = torch.where(turning, rotation.rotate(sinks, evicted), keys[:, :, :count])
        write_slots((keys,), torch.arange(count, device=keys.device)[None], (turned,))
