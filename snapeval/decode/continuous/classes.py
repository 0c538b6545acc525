"""The batcher's rows in capacity classes: each request decodes in a row sized for what it holds.

A grid's settings need very different rows: the full cache every prompt token plus the answer, a
SnapStream setting its budget. Rows all sized for the largest request would make every compressed row
attend over (and allocate) the full cache's slots at every step. :func:`plan_classes` groups the
requests by the slots they need into a few classes and gives each class rows in proportion to its
requests; :class:`RowClasses` holds one :class:`~snapeval.cache.slots.SlotCache` per class, stacked as
consecutive rows of one batch, and is the cache the model's decode step is handed (an
:class:`~snapeval.cache.attended.AttendedCache`). A decode step is still one model call (the weights are
read once); at each layer the snapeval attention attends each class over its own slots
(:meth:`RowClasses.decode_parts`).
A row's result does not depend on the class it sits in: its slots past what it holds are masked out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from snapeval.cache import SnapevalCache
from snapeval.cache.attended import AttendedCache, AttendedLayers, DecodeCall, DecodePart
from snapeval.cache.row_eviction import Reselection
from snapeval.cache.slots import SlotCache

MAX_CLASSES = 8
"""The most classes of rows: each adds an attention call per layer and step."""
NEAR = 7 / 8
"""Classes whose capacities are within this ratio are merged: the rows they would save are few."""


def plan_classes(needs: Iterable[int], rows: int) -> list[tuple[int, int]]:
    """(capacity, rows) per class, ascending capacity, for requests needing ``needs`` slots and ``rows``
    rows in all: near capacities merged, then the classes that waste fewest slots when merged into the
    next larger one until at most ``min(rows, MAX_CLASSES)`` remain; each class gets one row, and every
    further row goes to the class with the most requests per row."""
    classes = sorted(Counter(needs).items())  # (capacity, requests)
    limit = min(rows, MAX_CLASSES)

    def merge(index: int) -> None:  # class ``index`` into the next larger one
        (_, requests), (capacity, more) = classes[index], classes[index + 1]
        classes[index : index + 2] = [(capacity, requests + more)]

    while near := [i for i in range(len(classes) - 1) if classes[i][0] >= NEAR * classes[i + 1][0]]:
        merge(near[0])
    while len(classes) > limit:
        waste = [classes[i][1] * (classes[i + 1][0] - classes[i][0]) for i in range(len(classes) - 1)]
        merge(waste.index(min(waste)))
    counts = [1] * len(classes)
    for _ in range(rows - len(classes)):
        most = max(range(len(classes)), key=lambda index: classes[index][1] / counts[index])
        counts[most] += 1
    return [(capacity, count) for (capacity, _), count in zip(classes, counts, strict=True)]


class RowClasses(AttendedCache):
    """Rows in classes of their own capacity (``parts``, ascending), as the one cache of the model's step.

    Row ``index`` of the batch is row ``index - offset`` of the part that holds it (:meth:`locate`). A
    decode step, every phase here: :meth:`begin_step` (each part's slot for the token about to come);
    the model's call, handed this cache, ``attention_mask=model_mask`` and ``position_ids=seen[:, None]``,
    in which every layer calls :meth:`update` (each part writes its rows' token), then the snapeval
    attention :meth:`note_attended`, :meth:`decode_parts` (each part's keys, values and masks) and
    :meth:`record`; :meth:`end_step` (the cursors advance); and, once the step's tokens are read,
    :meth:`check_step_attended`.
    """

    def __init__(self, parts: list[SlotCache], split_decode: bool = False) -> None:
        self.parts = parts
        self.split_decode = split_decode  # the attention splits each row's slots into chunks (a GPU's)
        self.offsets = [sum(part.rows for part in parts[:index]) for index in range(len(parts))]
        self.rows = sum(part.rows for part in parts)
        self.capacity = parts[-1].capacity
        device = parts[0].seen.device
        self.attended = AttendedLayers(parts[0].num_layers, device)
        self.model_mask = torch.ones(self.rows, 1, 1, 1, dtype=torch.bool, device=device)
        """What the model's call is handed as its ``attention_mask``: a 4D mask, which transformers passes
        on as it is (it builds none of its own from this cache) and the snapeval attention never reads at
        decode (each part's masks, :meth:`decode_parts`, replace it)."""

    @classmethod
    def for_model(
        cls, model: torch.nn.Module, plan: list[tuple[int, int]], shapes: tuple, split_decode: bool = False
    ) -> RowClasses:
        """Rows for ``model`` in the classes of ``plan`` (:func:`plan_classes`), attended with
        :func:`~snapeval.cache.decode_attention.split_decode_attention` when ``split_decode``."""
        parts = [SlotCache.for_model(model, rows, capacity, shapes) for capacity, rows in plan]
        return cls(parts, split_decode)

    # --- rows -----------------------------------------------------------------------------------
    def part_index(self, row: int) -> int:
        """The index of the part holding batch row ``row``."""
        return max(index for index, offset in enumerate(self.offsets) if offset <= row)

    def locate(self, row: int) -> tuple[SlotCache, int]:
        """The part holding batch row ``row`` and the row's index in it."""
        index = self.part_index(row)
        return self.parts[index], row - self.offsets[index]

    def part_of(self, slots: int) -> int:
        """The index of the smallest part whose rows hold ``slots`` (the largest if none does)."""
        return next((i for i, part in enumerate(self.parts) if part.capacity >= slots), len(self.parts) - 1)

    def load_row(self, row: int, cache: SnapevalCache, new_tokens: int) -> int:
        """Copy a prefilled ``cache`` into batch row ``row`` (see :meth:`SlotCache.load_row`)."""
        part, index = self.locate(row)
        return part.load_row(index, cache, new_tokens)

    def reselect_row(self, row: int, due: Reselection) -> int:
        """Re-select batch row ``row`` between steps (see :meth:`SlotCache.reselect_row`)."""
        part, index = self.locate(row)
        return part.reselect_row(index, due)

    def admit(self, cache: SnapevalCache, prompt_length: int = 0) -> None:
        """Prepare every part's step for rows loaded from ``cache`` (see :meth:`SlotCache.admit`)."""
        for part in self.parts:
            part.admit(cache, prompt_length)

    def grown(self, capacity: int) -> RowClasses:
        """A copy whose largest part holds ``capacity`` slots per row (see :meth:`SlotCache.grown`)."""
        return RowClasses([*self.parts[:-1], self.parts[-1].grown(capacity)], self.split_decode)

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer of every part (their storage never changes while they live)."""
        parts = [tensor for part in self.parts for tensor in part.tensors()]
        return [*parts, self.attended.flags, self.model_mask]

    # --- one decode step ------------------------------------------------------------------------
    @property
    def seen(self) -> torch.Tensor:
        """(rows,) tokens each row has seen: the position of the token it is fed next."""
        if len(self.parts) == 1:
            return self.parts[0].seen
        return torch.cat([part.seen for part in self.parts])

    def begin_step(self) -> None:
        for part in self.parts:
            part.begin_step()
        self.attended.clear()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """transformers' cache hook: write each row's token into its part. It returns the step's own
        states, which the attention does not read: it attends each part's (:meth:`decode_parts`)."""
        for rows, part in self._rows_of_parts():
            part.write(key_states[rows], value_states[rows], layer_idx)
        return key_states, value_states

    def note_attended(self, layer_idx: int) -> None:
        self.attended.note(layer_idx)

    def decode_parts(self, call: DecodeCall) -> list[DecodePart]:
        """Per part: its batch rows, the keys and values they hold at the call's layer and their mask
        (built here, where the attention reads it)."""
        layer_idx, heads = call.layer_idx, call.query.shape[1]
        return [
            DecodePart(
                rows,
                part.keys_to_attend(layer_idx),
                part.values_to_attend(layer_idx),
                part.attention_mask(layer_idx, heads, call.window),
            )
            for rows, part in self._rows_of_parts()
        ]

    @property
    def wants_layer_inputs(self) -> bool:
        """Whether the step hands the attention its module's inputs (a row's method scores from them)."""
        return any(part.wants_layer_inputs for part in self.parts)

    def record(
        self, layer_idx: int, query: torch.Tensor, module: torch.nn.Module, inputs: Mapping[str, Any] | None
    ) -> None:
        """After a step's attention of ``layer_idx``: each part notes its rows' query and inputs."""
        for rows, part in self._rows_of_parts():
            hidden = {"hidden_states": inputs["hidden_states"][rows]} if inputs else None
            part.record(layer_idx, query[rows], module, hidden)

    def end_step(self) -> None:
        for part in self.parts:
            part.end_step()

    def check_step_attended(self) -> None:
        """After a step: raise if a layer's attention did not take the cache (the engine was bypassed)."""
        self.attended.check()

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """What transformers < 5.3 asks before a step (for cache positions that the explicit position ids
        and mask make unused): rows differ, so there is no one length; 0."""
        return 0

    def _rows_of_parts(self) -> list[tuple[slice, SlotCache]]:
        """Each part with its rows of the batch."""
        return [(slice(o, o + part.rows), part) for o, part in zip(self.offsets, self.parts, strict=True)]
