"""The base class of all caches, and what a method sees of a layer's prompt and keeps of it.

A subclass of :class:`SnapevalCache` states its algorithm in :meth:`SnapevalCache.select`: from a layer's
:class:`LayerPrompt` (its post-RoPE keys and queries at the end of prefill) it returns a
:class:`Selection`, which the layer's storage (:class:`~snapeval.cache.layer.KVLayer`, where the rules
for rings and sliding windows are) keeps.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from transformers.cache_utils import Cache

from snapeval.cache.eviction import Eviction, compacted
from snapeval.cache.layer import KVLayer, Selection
from snapeval.cache.mla import is_latent, latent_keys, latent_queries
from snapeval.cache.ring import EMPTY
from snapeval.configs.methods import method_params, parameter_names, stored_params
from snapeval.couplings import engine_bypassed
from snapeval.errors import SnapevalError

LAYER_WINDOW = "snapeval_sliding_window"  # an attention module's sliding window, as its prefill passed it


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

    At a decode-time re-selection (:mod:`snapeval.cache.eviction`) the same fields describe what a layer
    holds: ``keys``/``values`` its held slots in storage order, ``positions`` (batch, cache_heads, S) their
    input columns, ``query`` the recent queries (oldest first; possibly none), ``valid`` all true,
    ``prompt_length`` the columns before decoding began, and ``inputs`` the recent attention inputs
    (``hidden_states`` (batch, n, hidden), oldest first) and the last fed token's
    ``position_embeddings``.
    """

    keys: torch.Tensor
    query: torch.Tensor
    valid: torch.Tensor
    scaling: float
    scores: dict = field(default_factory=dict)
    values: torch.Tensor | None = None
    module: torch.nn.Module | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    positions: torch.Tensor | None = None
    prompt_length: int | None = None

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


class SnapevalCache(Cache):
    """Base of every snapeval cache. A subclass states its algorithm in :meth:`select`.

    Use it like any transformers cache: ``model.generate(ids, past_key_values=SnapStreamCache(budget=1024))``
    on a model prepared with :func:`snapeval.cache.install`. A cache object serves one generation.
    """

    method: str = "base"
    """The name in configs and results (a declared method's: its declaration's)."""
    label: str = ""
    """The name in figures (a declared method's: its declaration's)."""
    params_class: ClassVar[type | None] = None
    """The method's declaration (a dataclass of :mod:`snapeval.configs.cache`): its name and label, and
    the constructor's keyword arguments, checked by it and each kept as an attribute of that name."""
    wants_layer_inputs = False
    """True for a method that scores from an attention module's forward inputs (:class:`LayerPrompt`)."""
    selects_before_prefill = False
    """True for a method that chooses which prompt tokens to prefill (:meth:`prefill_input`): its prefill
    is its own, never shared with other settings."""
    owns_decode_mask = True
    """The snapeval attention asks the cache for its decode masks (:meth:`attention_mask`)."""
    unattended: int | None = None
    """The layer whose keys this cache took last and whose attention has not yet taken the cache."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declaration = vars(cls).get("params_class")
        if declaration is not None and isinstance(vars(declaration).get("label"), str):
            cls.method, cls.label = declaration.__dataclass_fields__["method"].default, declaration.label

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.parameter_names()))
        if unknown:
            raise TypeError(f"{type(self).__name__} takes no parameter {', '.join(unknown)}")
        made = method_params(self.params_class, params) if self.params_class is not None else None
        super().__init__(layer_class_to_replicate=KVLayer)
        for name in self.parameter_names():
            setattr(self, name, getattr(made, name))

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

    @abstractmethod
    def select(self, prompt: LayerPrompt) -> Selection:
        """Choose what a layer keeps of its ``prompt``."""

    @classmethod
    def parameter_names(cls) -> list[str]:
        """The method's parameters: the fields of its ``params_class`` that it takes."""
        return parameter_names(cls.params_class)

    def params(self) -> dict:
        """The method and its parameters, as stored with results."""
        return {"method": self.method, **stored_params(self.params_class, self)}

    def decode_eviction(self, prompt_length: int) -> Eviction | None:
        """How this cache evicts while decoding after a prompt of ``prompt_length`` tokens, or None: it
        never re-selects (a method that does overrides this and :meth:`reselect`)."""
        return None

    def reselect(self, held: LayerPrompt, keep: int) -> torch.Tensor:
        """(batch, cache_heads, n <= keep) the slots of ``held`` (a layer's held slots, see
        :class:`LayerPrompt`) to keep at a decode-time re-selection, in the order to store them."""
        raise NotImplementedError(f"{type(self).__name__} does not re-select while decoding")

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
        self.keep_prompt(self.layers[layer_idx], self.layer_prompt(layer_idx, *args, **kwargs))

    def keep_prompt(self, layer: KVLayer, prompt: LayerPrompt) -> None:
        """Compress ``layer``'s prefilled ``prompt`` to this method's selection, and note how the method
        re-selects it while decoding, if it does."""
        layer.keep(prompt.valid, self.select(prompt), prompt.sliding_window)
        layer.eviction = self.decode_eviction(prompt.length)

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
        self.keep_prompt(layer, prompt)

    def attention_mask(
        self, layer_idx: int, query_length: int, num_heads: int, window: int | None = None
    ) -> torch.Tensor | None:
        """The decode mask of ``layer_idx`` (``window``: the layer's sliding window, if it has one)."""
        return self.layers[layer_idx].attention_mask(query_length, num_heads, window)

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

    def reselected(
        self, held: LayerPrompt, eviction: Eviction
    ) -> tuple[tuple[torch.Tensor, ...], int] | None:
        """The row a re-selection leaves of ``held`` and how many slots it keeps: the slots
        :meth:`reselect` names, first, in a row of ``eviction.slots`` slots; None for a row holding no more
        than ``eviction.keep`` (left as it is)."""
        if held.length <= eviction.keep:
            return None
        kept = self.reselect(held, eviction.keep)
        if not 0 < kept.shape[-1] < eviction.slots:
            raise SnapevalError(f"{self.method} kept {kept.shape[-1]} of {eviction.slots} slots", "cache")
        return compacted((held.keys, held.values, held.positions), kept, eviction.slots), kept.shape[-1]

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


def resolve_budget(budget: int | None, ratio: float | None, prompt_length: int, minimum: int) -> int:
    """Slots for a prompt: ``budget`` as given, or ``ceil(ratio * prompt_length)`` (at least ``minimum``)."""
    if budget is not None:
        return budget
    return max(minimum, math.ceil(ratio * prompt_length))
