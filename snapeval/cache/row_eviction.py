"""Decode-time eviction in the batcher's rows: what each step feeds them is recorded inside the compiled
step, and a row is re-selected between steps, by the rule and the gather single-sequence caches use
(:mod:`snapeval.cache.eviction`).

:class:`StepRecorder` keeps, per full-attention layer, rings of the rows' recent queries and attention
inputs, written at each row's own step count with tensor operations only (so the step still compiles to
one graph; the Python flag ``active`` decides, before compiling, whether the step records at all).
:meth:`StepRecorder.reselect_row` runs between steps, for one row whose rule says it is due: each full
layer's held slots are scored by the row's method and its kept slots gathered to the front of the row,
in place (the buffers keep their storage, so a compiled step and a CUDA graph read them as before).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from snapeval.cache.attention import LOCAL_HEADS, ROTARY_MODULE
from snapeval.cache.base import EMPTY, SnapevalCache
from snapeval.cache.eviction import Eviction, Recent
from snapeval.cache.layer import to_storage
from snapeval.cache.ring import RowRings
from snapeval.errors import SnapevalError

QUERIES, HIDDEN = "queries", "hidden_states"


@dataclass(frozen=True)
class Reselection:
    """A row due for re-selection: the ``method`` that scores it and its ``eviction`` rule, the tokens it
    holds (``held``), the steps it was ``fed`` since it was loaded and ``since`` its last re-selection, and
    its ``prompt_length`` (its columns before decoding)."""

    method: SnapevalCache
    eviction: Eviction
    held: int
    fed: int
    since: int
    prompt_length: int


class StepRecorder:
    """The recent queries and attention inputs of every row of a slot cache, per full-attention layer."""

    def __init__(
        self,
        rows: int,
        windows: list[int | None],
        modules: Mapping[int, torch.nn.Module],
        device: torch.device,
    ) -> None:
        self.modules = modules  # the model's attention modules by layer index
        self.full_layers = [index for index, window in enumerate(windows) if window is None]
        self.recent: dict[str, dict[int, Recent]] = {QUERIES: {}, HIDDEN: {}}
        self.fed = torch.zeros(rows, dtype=torch.long, device=device)  # steps each row was fed since loaded
        self.active = False  # a Python flag: the step records only when a row's method needs it

    def prepare(self, eviction: Eviction, dtype: torch.dtype) -> None:
        """Make room for what ``eviction`` reads (rings at least that long); call before compiling."""
        rows, device = self.fed.shape[0], self.fed.device
        for name, size in ((QUERIES, eviction.queries), (HIDDEN, eviction.hidden)):
            if size == 0:
                continue
            for index in self.full_layers:
                held = self.recent[name].get(index)
                if held is None or held.size < size:
                    shape = _entry_shape(self.modules[index], name)
                    self.recent[name][index] = Recent(rows, size, shape, dtype, device)
            self.active = True

    @property
    def wants_layer_inputs(self) -> bool:
        return bool(self.recent[HIDDEN])

    def record(self, layer_idx: int, query: torch.Tensor, inputs: Mapping[str, Any] | None) -> None:
        """Write the step's query (rows, heads, 1, d) and attention input of ``layer_idx``."""
        if layer_idx in self.recent[QUERIES]:
            self.recent[QUERIES][layer_idx].write(query[:, :, 0], self.fed)
        if layer_idx in self.recent[HIDDEN]:
            self.recent[HIDDEN][layer_idx].write(inputs["hidden_states"][:, -1], self.fed)

    def end_step(self) -> None:
        if self.active:
            self.fed.add_(1)

    def entries(self, name: str, layer_idx: int, row: int, fed: int, wanted: int) -> torch.Tensor | None:
        """(1, n, ...) the row's last n <= ``wanted`` recorded ``name`` entries, oldest first."""
        recent = self.recent[name].get(layer_idx)
        return None if recent is None or wanted == 0 else recent.last(row, fed, wanted)

    def tensors(self) -> list[torch.Tensor]:
        return [self.fed, *(recent.buffer for rings in self.recent.values() for recent in rings.values())]

    def copy_from(self, other: StepRecorder) -> None:
        self.recent, self.modules = other.recent, other.modules
        self.fed.copy_(other.fed)
        self.active = other.active

    def reselect_row(
        self,
        buffers: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]],
        rings: RowRings,
        row: int,
        due: Reselection,
        dtype: torch.dtype,
    ) -> int:
        """Re-select ``row`` of a slot cache's ``buffers`` (keys, values, columns per layer) and full-layer
        ``rings`` in place, as ``due`` says, its keys and values scored as read back in ``dtype`` (the
        model's) and stored again as the buffers are. Returns the tokens the row holds."""
        method, eviction, held, fed, since = due.method, due.eviction, due.held, due.fed, due.since
        prompt_length, kept = due.prompt_length, held
        for index in self.full_layers:
            module = self.modules[index]
            keys, values, positions = (layers[index] for layers in buffers)
            states = (keys[row : row + 1, :, :held].to(dtype), values[row : row + 1, :, :held].to(dtype))
            states = (*states, positions[row : row + 1, :, :held])
            hidden = self.entries(HIDDEN, index, row, fed, eviction.wanted(HIDDEN, since))
            position_embeddings = None
            if hidden is not None:  # the last fed token's, as its step computed them
                column = torch.tensor([[prompt_length + fed - 1]], device=keys.device)
                position_embeddings = getattr(module, ROTARY_MODULE)(hidden, column)
            queries = self.entries(QUERIES, index, row, fed, eviction.wanted(QUERIES, since))
            prompt = method.held_slots(states, queries, hidden, module, position_embeddings, prompt_length)
            reselected = method.reselected(prompt, eviction)
            if reselected is None:
                return held
            (new_keys, new_values, new_positions), kept = reselected
            width = new_keys.shape[2]
            if width > keys.shape[2]:
                raise SnapevalError(f"a row of {width} slots does not fit this slot cache's {keys.shape[2]}")
            keys[row, :, :width] = to_storage(new_keys[0], keys.dtype)
            values[row, :, :width] = to_storage(new_values[0], values.dtype)
            positions[row] = EMPTY
            positions[row, :, :width] = new_positions[0]
        rings.valid[row] = rings.slot_index < kept
        rings.start[row], rings.size[row], rings.next[row] = 0, eviction.slots, kept
        rings.wraps[row] = 0  # its cursor came round only because the row filled: nothing was overwritten
        return kept


def _entry_shape(module: torch.nn.Module, name: str) -> tuple[int, ...]:
    """One step's entry of ``module``'s layer: its query (heads, query width) or attention input."""
    config = module.config
    if name == HIDDEN:
        return (config.hidden_size,)
    width = getattr(module, "qk_head_dim", None) or module.head_dim  # MLA: nope + rope per head
    return (getattr(module, LOCAL_HEADS, None) or config.num_attention_heads, width)  # a rank's own, under TP
