"""The method contract: what a KV-cache method sees and decides, with no transformers plumbing.

A method states its algorithm in :meth:`CacheMethod.select`: from a layer's :class:`LayerPrompt` (its
post-RoPE keys and queries at the end of prefill) it returns a :class:`Selection`, which the layer's
storage (:class:`~snapeval.cache.layer.KVLayer`, where the rules for rings and sliding windows are)
keeps. A method that re-selects while decoding says how (:meth:`CacheMethod.decode_eviction`) and what
(:meth:`CacheMethod.reselect`). Its parameters and name come from its declaration
(:mod:`snapeval.configs.cache`). :class:`~snapeval.cache.base.SnapevalCache` adds what transformers
needs of a cache.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from snapeval.cache.eviction import Eviction, compacted
from snapeval.cache.layer import Selection
from snapeval.cache.mla import is_latent, latent_keys, latent_queries
from snapeval.configs.methods import method_params, parameter_names, stored_params
from snapeval.errors import SnapevalError

__all__ = ["CacheMethod", "LayerPrompt", "Selection", "resolve_budget"]

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

    In a chunked prefill (``cache.prefill_chunk``) each chunk's selection reads the held slots followed by
    the chunk: ``keys``/``values`` the held slots in column order then the chunk's, ``positions`` their
    columns, ``valid`` the held slots' and the chunk's, ``query`` the chunk's queries, and
    ``prompt_length`` the whole prompt's length. Slot i of such a prompt stands where column i stands in a
    whole one: the first slots are its first columns held, the last ones its last columns, and a
    :class:`Selection` names slots.
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
    def whole_length(self) -> int:
        """The prompt's length in columns, what a ``ratio`` budget is a share of: its ``prompt_length``
        where given (a chunk of a chunked prefill: the whole prompt's), else :attr:`length`."""
        return self.prompt_length or self.length

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


class CacheMethod(ABC):
    """A KV-cache method: its declaration's parameters as attributes, what it keeps of a layer's prompt,
    and how it re-selects while decoding."""

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
    kv_dtype: str | None = None
    """What its layers store kept keys and values in (``cache.kv_dtype``; None: the model's dtype), a
    parameter of every declared method (:func:`~snapeval.cache.layer.storage_dtype`)."""

    prefill_chunk: int | None = None
    """Prompt tokens prefilled per model call (``cache.prefill_chunk``; None: the whole prompt in one), a
    parameter of every declared method: each chunk after the first attends to what the cache holds and
    the method selects again from that and the chunk (:class:`~snapeval.cache.base.SnapevalCache`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declaration = vars(cls).get("params_class")
        if declaration is not None and isinstance(vars(declaration).get("label"), str):
            cls.method, cls.label = declaration.__dataclass_fields__["method"].default, declaration.label

    @property
    def prefills_alone(self) -> bool:
        """Whether this cache's prefill is its own, never shared with other settings: it chooses what to
        prefill, or prefills in chunks (what it holds after the first differs by method)."""
        return self.selects_before_prefill or self.prefill_chunk is not None

    def take_params(self, params: Mapping[str, Any]) -> None:
        """Check ``params`` against the declaration and keep each as an attribute of its name."""
        unknown = sorted(set(params) - set(self.parameter_names()))
        if unknown:
            raise TypeError(f"{type(self).__name__} takes no parameter {', '.join(unknown)}")
        given = {"method": self.method, **params}
        made = None if self.params_class is None else method_params(self.params_class, given)
        for name in self.parameter_names():
            setattr(self, name, getattr(made, name))

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


def resolve_budget(budget: int | None, ratio: float | None, prompt_length: int, minimum: int) -> int:
    """Slots for a prompt: ``budget`` as given, or ``ceil(ratio * prompt_length)`` (at least ``minimum``)."""
    if budget is not None:
        return budget
    return max(minimum, math.ceil(ratio * prompt_length))
