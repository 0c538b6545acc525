"""Several caches filled from one prefill: every setting of a sweep grid for the price of one.

SnapKV, SnapStream, StreamingLLM and the full cache all compress a layer from the same thing: the full
prompt's keys, values and queries at that layer, computed with uncompressed attention. Compression only
acts after the layer's prefill attention, so the prefill itself (every layer's hidden states, the
prompt's last logits) is the same whatever the settings. A :class:`CacheGrid` runs that prefill once and,
at each layer, lets every member cache select and keep its own part (:meth:`SnapevalCache.fill_layer`),
sharing SnapKV's window attention between members with the same window (:func:`snapkv_priority`).

Each member then holds exactly what it would hold after prefilling the prompt alone, and decodes on its
own (or as one row of a :class:`~snapeval.decode.continuous.ContinuousBatcher`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from snapeval.cache.base import SnapevalCache
from snapeval.cache.method import LayerPrompt, Selection
from snapeval.errors import SnapevalError


class CacheGrid(SnapevalCache):
    """A prefill-only cache that fills ``members`` (distinct snapeval caches) from one forward pass.

    Pass it to one prefill call (``model(prompt, past_key_values=grid)``), then decode with the members;
    the grid itself keeps nothing once a layer is handed over.
    """

    method = "grid"

    def __init__(self, members: Sequence[SnapevalCache]) -> None:
        if not members:
            raise SnapevalError("a cache grid needs at least one member cache", "grid")
        self.wants_layer_inputs = any(member.wants_layer_inputs for member in members)
        if any(member.prefills_alone for member in members):
            message = "a method that chooses what to prefill, or prefills in chunks, cannot share a prefill"
            raise SnapevalError(message, "grid")
        super().__init__()
        self.members = list(members)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if len(self.layers) > layer_idx and self.layers[layer_idx].prefilled:
            raise SnapevalError("a cache grid serves one prefill; decode with its members", "grid")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def select(self, prompt: LayerPrompt) -> Selection:
        return Selection()

    def finish_prefill(self, layer_idx: int, *args, **kwargs) -> None:
        layer = self.layers[layer_idx]
        prompt = self.layer_prompt(layer_idx, *args, **kwargs)
        for member in self.members:
            member.fill_layer(layer_idx, prompt, layer.values)
        layer.keys = layer.values = layer.positions = None  # the members hold what they keep
        layer.prefilled = True

    def kv_bytes(self) -> int:
        return sum(member.kv_bytes() for member in self.members)
