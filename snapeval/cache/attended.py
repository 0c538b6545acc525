"""What the snapeval attention needs of a cache during a forward call: the engine's one declared seam.

The snapeval attention (:func:`snapeval.cache.attention.snapeval_attention`) drives a cache that is an
:class:`AttendedCache`; any other cache (or none) gets the model's base attention untouched. Two kinds
implement it: a single sequence's :class:`~snapeval.cache.base.SnapevalCache` (one method, one
generation) and the batcher's rows, :class:`~snapeval.decode.continuous.classes.RowClasses`.

At every layer of a decode step the attention calls, in this order:

1. :meth:`AttendedCache.note_attended`: the engine is in the loop (a method bypassed would hold the full
   cache under its name);
2. :meth:`AttendedCache.decode_parts`: the rows to attend, each group with the keys and values it holds
   and its own mask (a compressed cache holds tokens out of order, so only the cache knows that mask;
   the model's own mask is never read at decode), attended with split-KV chunks when
   :attr:`AttendedCache.split_decode`;
3. :meth:`AttendedCache.record`: the step's query (and the layer's inputs, for a cache that
   :attr:`~AttendedCache.wants_layer_inputs`), which a cache that evicts while decoding scores from.

A :class:`~snapeval.cache.base.SnapevalCache` is also prefilled through the attention (its own
``awaiting_prefill``/``finish_prefill``); the rows are loaded from prefilled caches and never prefill.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from snapeval.couplings import engine_bypassed


class DecodeCall(NamedTuple):
    """One layer's decode call as the attention is handed it: ``layer_idx``, the ``key`` and ``value`` the
    cache's ``update`` returned, the step's ``query`` (rows, heads, q, d), the attention ``module`` and its
    sliding ``window`` (None: a full layer)."""

    layer_idx: int
    key: torch.Tensor
    value: torch.Tensor
    query: torch.Tensor
    module: torch.nn.Module
    window: int | None


class DecodePart(NamedTuple):
    """One group of a decode step's rows: which of the batch's ``rows``, the ``keys`` and ``values`` they
    attend at a layer, and their ``mask`` (bool, True: attended; None: every slot)."""

    rows: slice
    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor | None


class AttendedCache(ABC):
    """A cache the snapeval attention attends over (see the module docstring for the order of calls)."""

    split_decode: bool = False
    """Whether one query token per row is attended by the split-KV attention (a GPU's few rows)."""

    @property
    @abstractmethod
    def wants_layer_inputs(self) -> bool:
        """Whether the attention hands :meth:`record` the attention module's forward inputs."""

    @abstractmethod
    def note_attended(self, layer_idx: int) -> None:
        """The snapeval attention took this cache for ``layer_idx``."""

    @abstractmethod
    def decode_parts(self, call: DecodeCall) -> list[DecodePart]:
        """The groups of rows a decode ``call`` attends, with what each attends."""

    @abstractmethod
    def record(
        self, layer_idx: int, query: torch.Tensor, module: torch.nn.Module, inputs: Mapping[str, Any] | None
    ) -> None:
        """After a decode step's attention of ``layer_idx``: note its ``query`` and the module's ``inputs``
        (None unless :attr:`wants_layer_inputs`)."""


class AttendedLayers:
    """Which layers' attention took a cache during one step, as a (layers,) bool tensor: written inside
    the step (a tensor write, so a compiled step or a CUDA graph records it too) and read after it."""

    def __init__(self, layers: int, device: torch.device) -> None:
        self.flags = torch.zeros(layers, dtype=torch.bool, device=device)

    def clear(self) -> None:
        """A new step: no layer attended yet."""
        self.flags.zero_()

    def note(self, layer_idx: int) -> None:
        self.flags[layer_idx] = True

    def check(self) -> None:
        """Raise, in one line, if a layer's attention did not take the cache (the engine was bypassed)."""
        if not bool(self.flags.all()):
            raise engine_bypassed(int((~self.flags).nonzero()[0, 0]))
