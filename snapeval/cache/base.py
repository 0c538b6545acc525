"""The base class of all caches: a :class:`~snapeval.cache.method.CacheMethod` as transformers needs a
cache to be (``update`` before each layer's attention, the prefill's compression) and as the snapeval
attention attends it (an :class:`~snapeval.cache.attended.AttendedCache`: decode masks, the engine's
in-the-loop check), and what a cache holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from transformers.cache_utils import Cache

from snapeval.cache.attended import AttendedCache, DecodeCall, DecodePart
from snapeval.cache.layer import KVLayer, storage_dtype
from snapeval.cache.method import CacheMethod, LayerPrompt
from snapeval.cache.ring import EMPTY
from snapeval.couplings import engine_bypassed
from snapeval.errors import SnapevalError


class SnapevalCache(CacheMethod, Cache, AttendedCache):
    """Base of every snapeval cache. A subclass states its algorithm in :meth:`select`.

    Use it like any transformers cache: ``model.generate(ids, past_key_values=SnapStreamCache(budget=1024))``
    on a model prepared with :func:`snapeval.cache.install`. A cache object serves one generation
    (:meth:`release` empties it for another).
    """

    unattended: int | None = None
    """The layer whose keys this cache took last and whose attention has not yet taken the cache."""
    prefill_length: int | None = None
    """The length of the prompt whose prefill comes in chunks (:meth:`prefill_spans`); None: in one call."""

    def __init__(self, **params: Any) -> None:
        self.take_params(params)
        super().__init__(layer_class_to_replicate=KVLayer)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """transformers' cache hook, called right before a layer's attention: the layer before this one must
        have been attended by the snapeval attention (:meth:`check_engine_in_loop`)."""
        if not torch.compiler.is_compiling():  # a compiled step is checked by its caller
            self.check_engine_in_loop()
            self.unattended = layer_idx
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def note_attended(self, layer_idx: int) -> None:
        """The snapeval attention took this cache for ``layer_idx`` (at prefill or decode)."""
        if self.unattended == layer_idx:
            self.unattended = None

    def check_engine_in_loop(self) -> None:
        """Raise, in one line, if a layer took keys that the snapeval attention never saw: a compressing
        method bypassed would hold the full cache under its name. Checked before every layer's keys and
        after every forward call of an installed model."""
        if self.unattended is not None:
            raise engine_bypassed(self.unattended)

    def prefill_spans(self, length: int) -> list[tuple[int, int]]:
        """The spans of a prompt of ``length`` tokens that its prefill feeds, one model call each: chunks
        of ``prefill_chunk`` tokens from its start (the last one the rest), or the whole prompt at once.
        After each chunk the method selects from what the layer holds and the chunk (the chunk's queries
        score them); after the last, its layout is made as after a whole prefill."""
        chunk = self.prefill_chunk
        self.prefill_length = length if chunk is not None and chunk < length else None
        if self.prefill_length is None:
            return [(0, length)]
        return [(start, min(start + chunk, length)) for start in range(0, length, chunk)]

    def chunk_mask(
        self, layer_idx: int, query_length: int, num_heads: int, window: int | None
    ) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """For a chunk after the first of a chunked prefill: the (batch, num_heads, q, slots) mask of its
        queries over the held slots and itself, from their columns (None: all visible,
        :meth:`KVLayer.attention_mask`), and (batch, slots) which slots are real; None before its first
        chunk or for a prefill in one call (the model's own mask serves)."""
        layer = self.layers[layer_idx]
        if not layer.chunked:
            return None
        return layer.attention_mask(query_length, num_heads, window), layer.positions[:, 0] >= 0

    def awaiting_prefill(self, layer_idx: int) -> bool:
        return not self.layers[layer_idx].prefilled

    def finish_prefill(self, layer_idx: int, *args, **kwargs) -> None:
        """Compress ``layer_idx`` right after its prefill attention (arguments: :meth:`layer_prompt`'s)."""
        self.keep_prompt(self.layers[layer_idx], self.layer_prompt(layer_idx, *args, **kwargs))

    def keep_prompt(self, layer: KVLayer, prompt: LayerPrompt) -> None:
        """Compress ``layer``'s prefilled ``prompt`` (or a chunk's: the held slots and the chunk) to this
        method's selection, and note how the method re-selects it while decoding, if it does."""
        final = self.prefill_length is None or layer.seen >= self.prefill_length
        stored = storage_dtype(self.kv_dtype)
        layer.keep(prompt.valid, self.select(prompt), prompt.sliding_window, stored, final)
        layer.eviction = self.decode_eviction(prompt.whole_length)

    def layer_prompt(
        self,
        layer_idx: int,
        query: torch.Tensor,
        valid: torch.Tensor,
        scaling: float,
        module: torch.nn.Module | None = None,
        inputs: Mapping[str, Any] | None = None,
    ) -> LayerPrompt:
        """Layer ``layer_idx``'s prompt as its prefill left it (a chunked prefill's: the held slots and
        the chunk, with their columns and the whole prompt's length), for :meth:`select`."""
        layer = self.layers[layer_idx]
        chunked = self.prefill_length is not None
        return LayerPrompt(
            layer.keys,
            query,
            valid,
            scaling,
            values=layer.values,
            module=module,
            inputs=inputs or {},
            positions=layer.positions if chunked else None,
            prompt_length=self.prefill_length,
        )

    def fill_layer(self, layer_idx: int, prompt: LayerPrompt, values: torch.Tensor) -> None:
        """Prefill and compress ``layer_idx`` from a prefill computed elsewhere (a shared one, see
        :class:`~snapeval.cache.grid.CacheGrid`): exactly what this cache's own prefill would hold."""
        while len(self.layers) <= layer_idx:
            self.layers.append(KVLayer())
        layer = self.layers[layer_idx]
        layer.update(prompt.keys, values)
        self.keep_prompt(layer, prompt)

    def decode_parts(self, call: DecodeCall) -> list[DecodePart]:
        """One part, every row: the held keys as :meth:`attention_keys` gives them, with the layer's mask."""
        layer_idx, key, value, query, module, window = call
        mask = self.layers[layer_idx].attention_mask(query.shape[2], query.shape[1], window)
        return [DecodePart(slice(None), self.attention_keys(layer_idx, key, module), value, mask)]

    def record(
        self, layer_idx: int, query: torch.Tensor, module: torch.nn.Module, inputs: Mapping[str, Any] | None
    ) -> None:
        """After the attention of a decode step of one token: note its query (and attention input), and
        re-select the layer if its method's rule says so (:mod:`snapeval.cache.eviction`)."""
        layer = self.layers[layer_idx]
        if not layer.evicts() or query.shape[2] != 1:
            return
        if query.shape[0] != 1:
            raise SnapevalError("a cache that evicts while decoding decodes one sequence; use the batcher")
        inputs = inputs or {}
        layer.record(query[:, :, 0], _step_input(inputs.get("hidden_states")))
        if layer.eviction.due(layer.filled, layer.since):
            held = self.held_slots(
                layer.held_states(),
                layer.recent_entries("queries"),
                layer.recent_entries("hidden_states"),
                module,
                inputs.get("position_embeddings"),
                prompt_length=layer.seen - layer.fed,
            )
            layer.take(self.reselected(held, layer.eviction))

    def held_slots(
        self,
        states: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        queries: torch.Tensor | None,
        hidden: torch.Tensor | None,
        module: torch.nn.Module,
        position_embeddings: Any,
        prompt_length: int,
    ) -> LayerPrompt:
        """A layer's held slots at a re-selection, as :meth:`reselect` reads them: ``states`` (keys,
        values, columns: (1, heads, S, ...)), the recorded ``queries`` (1, n, heads, d) and attention
        inputs ``hidden`` (1, n, hidden), the last step's ``position_embeddings``."""
        keys, values, positions = states
        query = queries.transpose(1, 2) if queries is not None else keys.new_zeros(1, 1, 0, keys.shape[-1])
        inputs = {"position_embeddings": position_embeddings}
        if hidden is not None:
            inputs["hidden_states"] = hidden
        valid = torch.ones(1, keys.shape[2], dtype=torch.bool, device=keys.device)
        scaling = getattr(module, "scaling", keys.shape[-1] ** -0.5)
        return LayerPrompt(
            keys,
            query,
            valid,
            scaling,
            values=values,
            module=module,
            inputs=inputs,
            positions=positions,
            prompt_length=prompt_length,
        )

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

    def release(self) -> None:
        """Drop every layer held (the rows it was copied into hold their copies): the cache is empty again,
        its method's parameters kept."""
        self.layers.clear()
        self.unattended = self.prefill_length = None


def _step_input(hidden: torch.Tensor | None) -> torch.Tensor | None:
    """(batch, hidden) a one-token step's attention input, from (batch, 1, hidden)."""
    return None if hidden is None else hidden[:, -1]


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
