"""Decode-time eviction: a row of fixed size that a method re-selects while it decodes.

A cache that compresses while decoding (R-KV, kvpress's decoding presses, SnapStream with
``reselect_every``) declares an :class:`Eviction`: its rows hold ``slots`` slots per layer and KV head,
and whenever the rule says a re-selection is due (every ``every`` decode steps, or when the row is full)
each full-attention layer keeps ``keep`` of what it holds: the method scores the held slots from a
:class:`~snapeval.cache.base.LayerPrompt` of them (keys, values, their input columns, the recent
queries and attention inputs the method asked to see) and names the slots to keep
(:meth:`~snapeval.cache.base.SnapevalCache.reselect`); they are gathered to the front of the row, in the
order the method named them, and new tokens go after them. Shapes never change, so the batcher's
compiled step stays one graph: its rows are re-selected between steps (:mod:`snapeval.cache.slots`), a
single-sequence cache's layers right after their decode attention (:mod:`snapeval.cache.layer`), by the
same rule and the same gather. A sliding-window layer keeps its ring of ``min(window, slots)`` slots.

Recent queries (post-RoPE, as the attention function receives them) and attention inputs are recorded
per layer at every decode step of one token (:class:`Recent`); the method sees the last ``queries`` fed
tokens' queries, and the attention inputs of the last ``hidden`` steps since the last re-selection (as
kvpress's hidden-state buffer, cleared at each compression).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Eviction:
    """How a cache evicts while decoding.

    ``keep``: tokens a row keeps at a re-selection; ``slots``: the row's slots (more than ``keep``);
    ``every``: re-select every ``every`` decode steps (kvpress's ``compression_interval``; a row holding
    at most ``keep`` is left as it is), or None: whenever the row holds ``slots`` tokens; ``queries`` /
    ``hidden``: how many recent queries / attention inputs per layer the method's scores read.
    """

    keep: int
    slots: int
    every: int | None = None
    queries: int = 0
    hidden: int = 0

    def wanted(self, name: str, since: int) -> int:
        """How many recorded ``name`` entries the method reads: the last ``queries`` queries, and the
        attention inputs (``hidden_states``) of at most the ``since`` steps since the last re-selection."""
        return self.queries if name == "queries" else min(self.hidden, since)

    def due(self, held: int, since: int) -> bool:
        """Whether a row holding ``held`` tokens, ``since`` decode steps after its last re-selection (or
        its prefill), is re-selected now."""
        if since < 1:
            return False
        return since >= self.every if self.every is not None else held >= self.slots


class Recent:
    """The last ``size`` entries per row of something every decode step feeds a layer (its queries, its
    attention inputs): a ring of (rows, size, ...) written at step ``count % size``."""

    def __init__(self, rows: int, size: int, shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
        self.buffer = torch.zeros(rows, size, *shape, dtype=dtype, device=device)

    @property
    def size(self) -> int:
        return self.buffer.shape[1]

    def write(self, entries: torch.Tensor, count: torch.Tensor | int) -> None:
        """Write one entry per row (``entries``: (rows, ...)) at ``count % size``: each row's own count
        ((rows,) tensor: the batcher's rows, inside the compiled step) or one for all rows (an int)."""
        if isinstance(count, int):
            self.buffer[:, count % self.size] = entries
            return
        rows = torch.arange(self.buffer.shape[0], device=self.buffer.device)
        self.buffer[rows, count % self.size] = entries  # an index_put_: stays in place under compile

    def last(self, row: int, count: int, wanted: int) -> torch.Tensor:
        """(1, n, ...) the last n = min(wanted, count, size) entries of ``row``, oldest first, after
        ``count`` were written."""
        n = min(wanted, count, self.size)
        order = (count - n + torch.arange(n, device=self.buffer.device)) % self.size
        return self.buffer[row, order][None]


def compacted(states: tuple[torch.Tensor, ...], kept: torch.Tensor, capacity: int) -> tuple:
    """``states`` (keys, values, positions: (1, heads, held, ...)) re-laid as a row of ``capacity`` slots:
    the slots ``kept`` (1, heads, n) names, in that order, then empty slots (positions -1)."""
    out = []
    for state in states:
        index = kept if state.dim() == 3 else kept[..., None].expand(-1, -1, -1, state.shape[-1])
        gathered = state.gather(2, index)
        shape = (*state.shape[:2], capacity, *state.shape[3:])
        row = state.new_full(shape, -1) if state.dim() == 3 else state.new_zeros(shape)
        row[:, :, : kept.shape[-1]] = gathered
        out.append(row)
    return tuple(out)
