"""What each decode row holds: its request and tokens so far, and its sampling settings as tensors."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

import torch

from snapeval.cache import SnapevalCache
from snapeval.cache.eviction import Eviction
from snapeval.cache.row_eviction import Reselection
from snapeval.cache.tensor_parallel import mean_over_ranks, tp_degree, whole_kv_bytes
from snapeval.decode.continuous.classes import RowClasses
from snapeval.decode.continuous.prefills import Prefill
from snapeval.decode.continuous.work import Answer, Request
from snapeval.decode.generation import Turn, forced_ids
from snapeval.decode.sampling import Sampling


@dataclass
class Row:
    """One row's request while it decodes: its tokens so far, its slots and its seconds; of a request of
    several turns, the turns it answered (``turns``), the tokens still to feed before its next answer
    (``forced``) and the tokens drawn over every turn (``drawn``: the counter of the next draw)."""

    request: Request
    method: str
    fixed: bool  # a fixed-capacity method (its slots are its capacity)
    slots: int
    pinned: int
    prefill_s: float
    tokens: list[int] = field(default_factory=list)
    decode_s: float = 0.0
    fed: int = 0
    evicting: SnapevalCache | None = None  # the method that re-selects the row while it decodes, if any
    eviction: Eviction | None = None
    held: int = 0  # tokens the row holds (an evicting row)
    since: int = 0  # steps since its last re-selection
    evictions: list[int] = field(default_factory=list)  # steps (tokens generated) at its re-selections
    turns: list[Turn] = field(default_factory=list)
    forced: deque[int] = field(default_factory=deque)
    drawn: int = 1

    @property
    def turns_left(self) -> bool:
        """Whether a follow-up turn remains after the answer being decoded."""
        return len(self.turns) < len(self.request.followups)

    def next_turn(self, stopped: str, last: int) -> None:
        """The current turn's answer ended (``last``: the token drawn last): keep it, and queue what is fed
        before the next one (:func:`~snapeval.decode.generation.forced_ids`)."""
        self.forced.extend(forced_ids(last, self.request.followups[len(self.turns)]))
        self.turns.append(Turn(tuple(self.tokens), stopped, self.decode_s))
        self.tokens, self.decode_s = [], 0.0

    def reselect(self, slots: RowClasses, index: int) -> None:
        """Note the step just fed and re-select the row (``index`` of ``slots``) if its method's rule
        says so (:mod:`snapeval.cache.eviction`)."""
        if self.eviction is None:
            return
        self.held, self.since = self.held + 1, self.since + 1
        if self.eviction.due(self.held, self.since):
            prompt_length = len(self.request.prompt_ids)
            due = Reselection(self.evicting, self.eviction, self.held, self.fed, self.since, prompt_length)
            kept = slots.reselect_row(index, due)
            if kept != self.held:
                self.evictions.append(self.fed)
            self.held, self.since = kept, 0


@dataclass
class RowSampling:
    """Every row's sampling settings as device tensors, and whether any row samples / uses top-p
    (Python flags: with neither, the step skips that work)."""

    do_sample: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    counter: torch.Tensor  # the index of the token each row draws next
    sampling: bool = False
    nucleus: bool = False

    @classmethod
    def empty(cls, rows: int, device: torch.device) -> RowSampling:
        flags = torch.zeros(rows, dtype=torch.bool, device=device)
        ones, zeros = torch.ones(rows, device=device), torch.zeros(rows, dtype=torch.long, device=device)
        return cls(flags, ones, ones.clone(), zeros, zeros.clone())

    def reset(self) -> None:
        """A new run: no row samples yet (each row's settings are set as it is loaded)."""
        self.sampling = self.nucleus = False

    def tensors(self) -> list[torch.Tensor]:
        """The settings' buffers (a compiled step reads them in place)."""
        return [self.do_sample, self.temperature, self.top_p, self.seed, self.counter]

    def set_row(self, index: int, sampling: Sampling) -> None:
        self.do_sample[index] = sampling.do_sample
        self.temperature[index] = sampling.temperature
        self.top_p[index] = sampling.top_p
        self.seed[index] = sampling.seed
        self.counter[index] = 0
        self.note(sampling)

    def note(self, sampling: Sampling) -> None:
        """Make the flags cover a row sampled so (a flag that changes makes a compiled step recompile)."""
        self.sampling = self.sampling or sampling.do_sample
        self.nucleus = self.nucleus or (sampling.do_sample and sampling.top_p < 1.0)


def load_row(slots: RowClasses, index: int, request: Request, prefill: Prefill, sampling: RowSampling) -> Row:
    """Copy the prefilled cache of ``request`` into row ``index`` and set the row's sampling."""
    cache = prefill.caches[request.setting]  # it holds the appended query already
    held = slots.load_row(index, cache, request.new_tokens)
    sampling.set_row(index, request.sampling)
    first = cache.layers[0]
    full = next((layer for layer in cache.layers if layer.window is None), first)
    eviction = full.eviction if full.evicts() else None
    return Row(
        request,
        cache.method,
        fixed=first.fixed,
        slots=held,
        pinned=first.held,
        prefill_s=prefill.seconds[request.setting],
        evicting=request.engine if eviction is not None else None,
        eviction=eviction,
        held=full.filled,
    )


def across_ranks(answer: Answer, model: torch.nn.Module, heads_here: int) -> Answer:
    """``answer`` as the model on one device gives it: under tensor parallel a rank holds its own
    ``heads_here`` KV heads, so its ``kv_bytes`` become the whole row's (:func:`whole_kv_bytes`; the rank's
    share is kept as ``kv_bytes_per_rank``) and its kept histogram, over those heads, is averaged over the
    ranks (every rank holds as many)."""
    if tp_degree(model) == 1:
        return answer
    whole = whole_kv_bytes(answer.kv_bytes, heads_here, model)
    answer = replace(answer, kv_bytes=whole, kv_bytes_per_rank=answer.kv_bytes)
    if answer.kept_histogram is None:
        return answer
    counts = torch.tensor(answer.kept_histogram["counts"], dtype=torch.float64, device=model.device)
    averaged = mean_over_ranks(counts, model).tolist()
    return replace(answer, kept_histogram={**answer.kept_histogram, "counts": averaged})


def answer_of(slots: RowClasses, row_index: int, row: Row, stopped: str) -> Answer:
    """The answer of the row ``row_index`` that stopped: its tokens, seconds, slots and kept prompt."""
    slots, index = slots.locate(row_index)
    held = row.slots if row.fixed else row.pinned + row.fed
    prompt_length = len(row.request.prompt_ids)
    compressed = not row.request.cache.is_full
    histogram = slots.kept_histogram(index, prompt_length) if compressed else None
    share = slots.kept_share(index, prompt_length) if compressed else None
    generated = (
        slots.kept_share(index, prompt_length + row.fed, prompt_length) if compressed and row.fed else None
    )
    turns = (*row.turns, Turn(tuple(row.tokens), stopped, row.decode_s))
    return Answer(
        row.request,
        row.tokens,
        stopped,
        row.prefill_s,
        sum(turn.decode_s for turn in turns),
        kv_bytes=slots.shapes.kv_bytes(held),
        ring_wraps=int(slots.ring_wraps[index]),
        kept_histogram=histogram,
        kept_share=share,
        evictions=tuple(row.evictions),
        kept_generated_share=generated,
        row=row_index,
        turns=turns,
    )
