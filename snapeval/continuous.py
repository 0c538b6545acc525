"""Continuous batching over a fixed-shape slot cache, with a decode step that compiles once.

:class:`ContinuousBatcher` owns ``rows`` decode slots (a :class:`~snapeval.cache.slots.SlotCache`,
allocated once for the largest request) and a queue of :class:`Request` s. Whenever a row is free, the
next request is prefilled on its own into a fresh snapeval cache (which compresses itself), and that
cache is copied into the row. Requests with the same prompt share one prefill: the draws of one
problem, and the points of a sweep grid, whose caches are all filled from that one prefill by a
:class:`~snapeval.cache.grid.CacheGrid`. Then one decode step advances every row by one token. A row
that stops frees its slot for the next request at once: the batch never waits for its longest row.
The queue may be topped up while it runs (``run(..., more=...)``): the runner claims samples from the
results database as rows free, so that workers on one point split it.

The decode step (tokens of every row -> next token of every row, sampling included) performs no host
synchronisation and no branch on tensor values; :meth:`ContinuousBatcher.step` may be compiled
(``torch.compile(fullgraph=True, dynamic=False)``, CUDA graphs on a GPU) and then runs every step of a
run, refills and ring wrap-around included, from one graph. The loop reads the new tokens once per step
to decide which rows stop.

Every answer equals the one-by-one :func:`snapeval.generation.generate` (the same tokens; sampled rows
draw their ``k``-th token from their own seed and counter ``k``, whatever row or batch they run in).
Seconds are honest per answer: its prefill (shared prefills split among their draws) and, per step,
the step's wall time divided among the rows that were decoding.

Longer than 350 lines: the batcher and the compiled decode step it drives are one mechanism.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from transformers import PreTrainedModel

from snapeval.batch_rows import check_rows_fit
from snapeval.cache import SnapevalCache, build_cache, effective_params, method_class
from snapeval.cache.grid import CacheGrid
from snapeval.cache.slots import SlotCache, cached_shapes
from snapeval.errors import SnapevalError
from snapeval.generation import append_logits, prefill_logits, synchronize, take_token
from snapeval.sampling import Sampling, sample_one, sample_tokens

COMPILE_MODES = ("auto", "off", "on")


@dataclass(frozen=True)
class Request:
    """One answer to generate: a prompt, the cache settings to compress it with, and how to stop.

    ``compress_at``: the prompt tokens before it are prefilled (and compressed) in one call, the rest
    appended. ``tag``: anything the caller needs back with the answer.
    """

    prompt_ids: tuple[int, ...]
    cache: Mapping[str, Any]
    max_new_tokens: int
    sampling: Sampling = Sampling()
    stop_ids: frozenset[int] = frozenset()
    compress_at: int | None = None
    should_stop: Callable[[list[int]], bool] | None = None
    tag: Any = None

    def prefill_key(self) -> tuple:
        """Requests with equal keys share one prefill, whatever their cache settings (except a method
        that chooses what to prefill: its prefill is its own)."""
        return self._prefill_key

    @cached_property
    def _prefill_key(self) -> tuple:
        own = method_class(self.cache.get("method")).selects_before_prefill
        return (self.prompt_ids, self.compress_at, self.setting if own else None)

    @cached_property
    def setting(self) -> tuple:
        """The effective cache settings (parameters a method ignores left out), built once."""
        return tuple(sorted(effective_params(self.cache).items()))


@dataclass
class Answer:
    """A finished request: its tokens, why it stopped, and what it cost."""

    request: Request
    tokens: list[int]
    stopped: str  # eos | length | stop
    prefill_s: float
    decode_s: float
    kv_bytes: int  # the row's own slots (a growing method: those it filled)
    ring_wraps: int  # times the row's ring came round to its first slot while decoding
    kept_histogram: dict[str, list[float]] | None  # compressed methods: share of the prompt held per bin
    kept_share: float | None = None  # compressed methods: share of the prompt held


@dataclass
class _Row:
    request: Request
    method: str
    fixed: bool  # a fixed-capacity method (its slots are its capacity)
    slots: int
    pinned: int
    prefill_s: float
    tokens: list[int] = field(default_factory=list)
    decode_s: float = 0.0
    fed: int = 0


@dataclass
class _RowSampling:
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
    def empty(cls, rows: int, device: torch.device) -> _RowSampling:
        flags = torch.zeros(rows, dtype=torch.bool, device=device)
        ones, zeros = torch.ones(rows, device=device), torch.zeros(rows, dtype=torch.long, device=device)
        return cls(flags, ones, ones.clone(), zeros, zeros.clone())

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


@dataclass
class _Prefill:
    """One prompt's prefill: a filled cache and first-token logits per setting, and seconds per request."""

    caches: dict[tuple, SnapevalCache] = field(default_factory=dict)
    logits: dict[tuple, torch.Tensor] = field(default_factory=dict)
    seconds: dict[tuple, float] = field(default_factory=dict)


def check_compile(mode: str) -> None:
    """Reject a ``run.compile`` value that is not one of :data:`COMPILE_MODES`."""
    if mode not in COMPILE_MODES:
        raise SnapevalError(f"choose one of {', '.join(COMPILE_MODES)}, got {mode!r}", "run.compile")


def compiles(mode: str, device: torch.device) -> bool:
    """Whether ``run.compile`` = ``mode`` compiles the decode step on ``device``.

    ``auto`` compiles on CUDA (where CUDA graphs remove the launch overhead that dominates a decode
    step) and not on CPU, where compiling takes minutes and gains little (see benchmarks/README.md).
    """
    check_compile(mode)
    return mode == "on" or (mode == "auto" and device.type == "cuda")


class ContinuousBatcher:
    """Generate answers for a queue of requests in ``rows`` slots, refilling each slot as it frees.

    ``compile``: auto | off | on (see :func:`compiles`). ``refill`` false waits until every row has
    stopped before admitting new requests: static batches at the same fixed shape (for comparison).
    """

    def __init__(self, model: PreTrainedModel, rows: int, compile: str = "off", refill: bool = True) -> None:
        if not isinstance(rows, int) or rows <= 0:
            raise SnapevalError(f"must be a positive integer, got {rows!r}", "run.batch_size")
        self.model, self.rows, self.refill = model, rows, refill
        self.compiled = compiles(compile, model.device)
        self.slots: SlotCache | None = None
        self.steps = 0  # decode steps run, and their wall seconds (all runs of this batcher)
        self.step_seconds = 0.0

    # --- the decode step -------------------------------------------------------------------------
    def step(self, slots: SlotCache, tokens: torch.Tensor, rows: _RowSampling) -> torch.Tensor:
        """Feed one token per row; return each row's next token (rows,). Tensor operations only."""
        slots.begin_step()
        logits = self.model(
            input_ids=tokens[:, None],
            position_ids=slots.seen[:, None],
            attention_mask=slots.mask(),
            past_key_values=slots,
            use_cache=True,
        ).logits[:, -1]
        slots.end_step()
        rows.counter.add_(1)
        return sample_tokens(
            logits,
            rows.do_sample,
            rows.temperature,
            rows.top_p,
            rows.seed,
            rows.counter,
            sampling=rows.sampling,
            nucleus=rows.nucleus,
        )

    # --- the run ---------------------------------------------------------------------------------
    @torch.no_grad()
    def run(
        self,
        requests: Iterable[Request],
        on_answer: Callable[[Answer], Iterable[Request] | None],
        more: Callable[[], Iterable[Request]] | None = None,
    ) -> None:
        """Answer every request; ``on_answer`` gets each answer as soon as its row stops and may return
        follow-up requests (a second pass), which are answered next. ``more``, when given, is asked for
        further requests whenever the queue runs dry and a row is free (the runner claims samples from
        the database as it goes), until it returns none."""
        queue = deque(requests)
        if not queue and more is not None:
            queue.extend(more())
        if not queue:
            return
        device = self.model.device
        self.reserve(queue)
        shares = Counter(request.prefill_key() for request in queue)
        state = _RowSampling.empty(self.rows, device)
        for request in queue:  # settle the step's Python flags before it first compiles
            state.note(request.sampling)
            self.slots.admit(build_cache(request.cache, strict=False))
        _pin_for_cuda_graphs([state.do_sample, state.temperature, state.top_p, state.seed, state.counter])
        step = self._compiled_step() if self.compiled else self.step
        tokens = torch.zeros(self.rows, dtype=torch.long, device=device)
        rows: list[_Row | None] = [None] * self.rows
        live: dict[tuple, _Prefill] = {}  # prompts with requests still to admit

        def enqueue(added: list[Request], first: bool) -> None:
            for request in added:
                shares[request.prefill_key()] += 1
                state.note(request.sampling)
                self.slots.admit(build_cache(request.cache, strict=False))
            if added and (needed := max(map(self._slots_needed, added))) > self.slots.capacity:
                self.slots = self.slots.grown(needed)  # rare: a request longer than any reserved for
                _pin_for_cuda_graphs(self.slots.tensors())
            if first:
                queue.extendleft(reversed(added))
            else:
                queue.extend(added)

        def finish(index: int, stopped: str) -> None:
            row = rows[index]
            rows[index] = None
            answer = self._answer(index, row, stopped)
            enqueue(list(on_answer(answer) or []), first=True)

        def pending() -> bool:
            """Whether a request waits, asking ``more`` for some when the queue is dry (until it has none)."""
            nonlocal more
            if not queue and more is not None:
                enqueue(list(more()), first=False)
                more = more if queue else None
            return bool(queue)

        while True:
            admit = self.refill or all(row is None for row in rows)
            for index in range(self.rows):
                while admit and rows[index] is None and pending():
                    request = queue.popleft()
                    key, setting = request.prefill_key(), request.setting
                    prefill = live.setdefault(key, _Prefill())
                    if setting not in prefill.caches:
                        self._prefill(request, queue, prefill)
                    shares[key] -= 1
                    if shares[key] == 0:
                        del live[key]  # its rows hold their copies
                    first = sample_one(prefill.logits[setting], request.sampling, 0)
                    rows[index] = self._load(index, request, prefill, state)
                    stopped = take_token(
                        rows[index].tokens,
                        first,
                        request.stop_ids,
                        request.max_new_tokens,
                        request.should_stop,
                    )
                    if stopped is not None:
                        finish(index, stopped)
                    else:
                        tokens[index] = first
            active = [index for index, row in enumerate(rows) if row is not None]
            if not active:
                if pending():
                    continue
                break
            start = time.perf_counter()
            tokens = step(self.slots, tokens, state).clone()
            drawn = tokens.tolist()  # the step's one host synchronisation
            elapsed = time.perf_counter() - start
            self.steps += 1
            self.step_seconds += elapsed
            for index in active:
                row = rows[index]
                row.decode_s += elapsed / len(active)
                row.fed += 1
                request = row.request
                stopped = take_token(
                    row.tokens, drawn[index], request.stop_ids, request.max_new_tokens, request.should_stop
                )
                if stopped is not None:
                    finish(index, stopped)

    # --- admission -------------------------------------------------------------------------------
    def _slots_needed(self, request: Request) -> int:
        split = request.compress_at or len(request.prompt_ids)
        appended = len(request.prompt_ids) - split
        cache = build_cache(request.cache, strict=False)
        return cache.decode_slots(split, appended + request.max_new_tokens)

    def reserve(self, requests: Iterable[Request]) -> None:
        """Allocate the slot cache for the largest of ``requests``; later runs reuse it (and its
        compiled step) while it is large enough."""
        capacity = max(self._slots_needed(request) for request in requests)
        if self.slots is None or self.slots.capacity < capacity:
            shapes = cached_shapes(self.model)  # one probing forward for the check and the rows
            check_rows_fit(self.rows, capacity, shapes, self.model.device)
            self.slots = SlotCache.for_model(self.model, self.rows, capacity, shapes)
            _pin_for_cuda_graphs(self.slots.tensors())

    def _compiled_step(self) -> Callable:
        """The step as one graph; on CUDA also captured as a CUDA graph (``reduce-overhead``)."""
        mode = "reduce-overhead" if self.model.device.type == "cuda" else None
        return torch.compile(self.step, fullgraph=True, dynamic=False, mode=mode)

    def _prefill(self, request: Request, queue: Iterable[Request], prefill: _Prefill) -> None:
        """Fill ``prefill`` with a cache for every setting that ``request`` and the queued requests of
        its prompt ask for and it lacks, from one prefill call; its seconds are split among them."""
        key = request.prefill_key()
        group = [request, *(other for other in queue if other.prefill_key() == key)]
        settings = {other.setting: other.cache for other in group if other.setting not in prefill.caches}
        caches = {setting: build_cache(params, strict=False) for setting, params in settings.items()}
        shared = next(iter(caches.values())) if len(caches) == 1 else CacheGrid(list(caches.values()))
        split = request.compress_at or len(request.prompt_ids)
        start = time.perf_counter()
        logits = prefill_logits(self.model, request.prompt_ids[:split], shared)[-1]
        for setting, cache in caches.items():  # the query of a query-agnostic prompt, per cache
            appended = append_logits(self.model, request.prompt_ids[split:], cache)
            prefill.logits[setting] = logits if appended is None else appended[-1]
        synchronize(self.model.device)
        share = (time.perf_counter() - start) / sum(other.setting in caches for other in group)
        prefill.caches.update(caches)
        prefill.seconds.update(dict.fromkeys(caches, share))

    def _load(self, index: int, request: Request, prefill: _Prefill, state: _RowSampling) -> _Row:
        cache = prefill.caches[request.setting]  # it holds the appended query already
        slots = self.slots.load_row(index, cache, request.max_new_tokens)
        state.set_row(index, request.sampling)
        first = cache.layers[0]
        return _Row(
            request,
            cache.method,
            fixed=first.fixed,
            slots=slots,
            pinned=first.held,
            prefill_s=prefill.seconds[request.setting],
        )

    def _answer(self, index: int, row: _Row, stopped: str) -> Answer:
        held = row.slots if row.fixed else row.pinned + row.fed
        prompt_length = len(row.request.prompt_ids)
        compressed = row.method != "full"
        histogram = self.slots.kept_histogram(index, prompt_length) if compressed else None
        share = self.slots.kept_share(index, prompt_length) if compressed else None
        return Answer(
            row.request,
            row.tokens,
            stopped,
            row.prefill_s,
            row.decode_s,
            kv_bytes=self.slots.row_bytes(held),
            ring_wraps=int(self.slots.ring_wraps[index]),
            kept_histogram=histogram,
            kept_share=share,
        )


def _pin_for_cuda_graphs(tensors: Iterable[torch.Tensor]) -> None:
    """Tell torch.compile that these buffers keep their address, so a CUDA graph reads them in place
    instead of copying them in at every replay (a no-op off CUDA)."""
    for tensor in tensors:
        if tensor.device.type == "cuda":
            torch._dynamo.mark_static_address(tensor)
