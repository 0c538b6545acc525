"""The batcher: ``rows`` decode slots refilled as they free, and the decode step that advances them.

:class:`ContinuousBatcher` holds what lasts across runs (the slot cache, the step counters);
:class:`_Run` one call of :meth:`ContinuousBatcher.run` (its queue, rows and the prefills still
shared), each part of its loop a method: admit requests to free rows, decode one step, finish a row,
top the queue up. A row whose answer to one turn ends with turns left is not freed: it is fed its
follow-up one token per step, through the same step (each token written as its input between steps),
and the token drawn at the last one begins its next answer.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator

import torch
from transformers import PreTrainedModel

from snapeval.cache.attention import cache_keyword
from snapeval.cache.slots import cached_shapes
from snapeval.decode.batch_rows import check_rows_fit
from snapeval.decode.continuous.classes import RowClasses, plan_classes
from snapeval.decode.continuous.compiled import (
    check_decode_attention,
    compile_step,
    pin_for_cuda_graphs,
    splits_decode,
    step_mode,
)
from snapeval.decode.continuous.graphs import GraphedStep
from snapeval.decode.continuous.prefills import Prefill, fill
from snapeval.decode.continuous.rows import Row, RowSampling, across_ranks, answer_of, load_row
from snapeval.decode.continuous.work import Answer, Request
from snapeval.decode.generation import take_token
from snapeval.decode.sampling import sample_one, sample_tokens
from snapeval.errors import SnapevalError


class ContinuousBatcher:
    """Generate answers for a queue of requests in ``rows`` slots, refilling each slot as it frees.

    ``compile``: auto | off | on | graphs (see :func:`~snapeval.decode.continuous.compiled.step_mode`).
    ``refill`` false waits until every row has stopped before admitting new requests: static batches at
    the same fixed shape (for comparison). ``decode_attention``: auto | grouped | split (see
    :func:`~snapeval.decode.continuous.compiled.splits_decode`). ``kv_dtype``: the ``cache.kv_dtype`` its
    rows store keys and values in (None: the model's dtype); a request of another is refused.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        rows: int,
        compile: str = "off",
        refill: bool = True,
        decode_attention: str = "auto",
        kv_dtype: str | None = None,
    ) -> None:
        if not isinstance(rows, int) or rows <= 0:
            raise SnapevalError(f"must be a positive integer, got {rows!r}", "run.batch_size")
        self.model, self.rows, self.refill, self.kv_dtype = model, rows, refill, kv_dtype
        self.mode = step_mode(compile, model.device)
        check_decode_attention(decode_attention)
        self.decode_attention = decode_attention
        self.slots: RowClasses | None = None
        self.sampling = RowSampling.empty(rows, model.device)  # kept across runs, as the slots are
        self.graphed: GraphedStep | None = None  # run.compile=graphs: its captures serve every run
        self.cache_keyword = cache_keyword(model)
        self.steps = 0  # decode steps run, and their wall seconds (all runs of this batcher)
        self.step_seconds = 0.0

    def step(self, slots: RowClasses, tokens: torch.Tensor, rows: RowSampling) -> torch.Tensor:
        """Feed one token per row; return each row's next token (rows,). Tensor operations only."""
        slots.begin_step()
        logits = self.model(
            input_ids=tokens[:, None],
            position_ids=slots.seen[:, None],
            attention_mask=slots.model_mask,
            use_cache=True,
            **{self.cache_keyword: slots},
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

    @torch.no_grad()
    def run(
        self,
        requests: Iterable[Request],
        on_answer: Callable[[Answer], Iterable[Request] | None],
        more: Callable[[], Iterable[Request]] | None = None,
        between_steps: Callable[[], None] | None = None,
    ) -> None:
        """Answer every request; ``on_answer`` gets each answer as soon as its row stops and may return
        follow-up requests (a second pass), which are answered next. ``more``, when given, is asked for
        further requests whenever the queue runs dry and a row is free (the runner claims samples from
        the database as it goes), until it returns none. ``between_steps``, when given, is called before
        every decode step (where tensor-parallel ranks stand in step: the runner stops them there)."""
        queue = deque(requests)
        if not queue and more is not None:
            queue.extend(more())
        if not queue:
            return
        self.reserve(queue)
        _Run(self, queue, on_answer, more).loop(between_steps)

    def reserve(self, requests: Iterable[Request]) -> None:
        """Allocate the rows for ``requests``, in classes sized for what they hold
        (:func:`~snapeval.decode.continuous.classes.plan_classes`); later runs reuse them (and their compiled
        step) while the largest is large enough."""
        needs = [request.slots_needed for request in requests]
        if self.slots is None or self.slots.capacity < max(needs):
            plan = plan_classes(needs, self.rows)
            shapes = cached_shapes(self.model)._replace(kv_dtype=self.kv_dtype)  # one probing forward
            check_rows_fit(plan, shapes, self.model.device)
            split = splits_decode(self.decode_attention, self.model.device, self.rows * shapes.kv_heads)
            self.slots = RowClasses.for_model(self.model, plan, shapes, split)
            pin_for_cuda_graphs(self.slots.tensors())


def check_kv_dtype(request: Request, kv_dtype: str | None) -> None:
    """Refuse, in one line, a request whose ``cache.kv_dtype`` is not ``kv_dtype``, the rows' (one slot
    cache stores one dtype)."""
    if request.cache.kv_dtype != kv_dtype:
        asked, rows = (dtype or "the model's dtype" for dtype in (request.cache.kv_dtype, kv_dtype))
        raise SnapevalError(f"a request stores {asked}, these rows {rows}: a batcher each", "cache.kv_dtype")


class _Run:
    """One call of :meth:`ContinuousBatcher.run`: its queues (one per class of rows, each request in that
    of the smallest rows it fits), its rows and their sampling settings, the prefills its queued requests
    still share, and how many requests of each prompt remain."""

    def __init__(
        self,
        batcher: ContinuousBatcher,
        queue: deque[Request],
        on_answer: Callable[[Answer], Iterable[Request] | None],
        more: Callable[[], Iterable[Request]] | None,
    ) -> None:
        device = batcher.model.device
        self.batcher, self.on_answer, self.more = batcher, on_answer, more
        self.queues: list[deque[Request]] = [deque() for _ in batcher.slots.parts]
        self.shares: Counter = Counter()
        self.sampling = batcher.sampling
        self.sampling.reset()
        self.enqueue(list(queue), first=False)  # settles the step's Python flags before it first compiles
        self.step = batcher.step
        if batcher.mode == "compiled":
            self.step = compile_step(batcher.step, device)
        elif batcher.mode == "graphs":
            batcher.graphed = batcher.graphed or GraphedStep(batcher.step)
            self.step = batcher.graphed
        self.tokens = torch.zeros(batcher.rows, dtype=torch.long, device=device)
        self.rows: list[Row | None] = [None] * batcher.rows
        self.live: dict[tuple, Prefill] = {}  # prompts with requests still to admit

    def loop(self, between_steps: Callable[[], None] | None) -> None:
        """Admit, then decode one step, until no row decodes and no request waits; ``between_steps``
        before each step."""
        while True:
            self.admit()
            active = [index for index, row in enumerate(self.rows) if row is not None]
            if not active:
                if self.pending():
                    continue
                break
            if between_steps is not None:
                between_steps()
            self.decode(active)

    def admit(self) -> None:
        """Start a waiting request in every free row (with static batches, only once all are free)."""
        if not (self.batcher.refill or all(row is None for row in self.rows)):
            return
        for index in range(self.batcher.rows):
            while self.rows[index] is None and (request := self.next_for(index)) is not None:
                self.start(index, request)

    def next_for(self, index: int) -> Request | None:
        """The next waiting request that row ``index`` holds: of its own class of rows, else of the
        nearest smaller class."""
        if not self.pending():
            return None
        part = self.batcher.slots.part_index(index)
        return next((queue.popleft() for queue in reversed(self.queues[: part + 1]) if queue), None)

    def waiting(self) -> Iterator[Request]:
        """Every queued request."""
        return itertools.chain.from_iterable(self.queues)

    def start(self, index: int, request: Request) -> None:
        """Load ``request`` into row ``index`` from its prompt's prefill and draw its first token."""
        key, setting = request.prefill_key(), request.setting
        prefill = self.live.setdefault(key, Prefill())
        if setting not in prefill.caches:
            fill(self.batcher.model, request, self.waiting(), prefill)
        first = sample_one(prefill.logits[setting], request.sampling, 0)
        row = self.rows[index] = load_row(self.batcher.slots, index, request, prefill, self.sampling)
        self.shares[key] -= 1
        if self.shares[key] == 0:
            del self.live[key]
            prefill.release()  # its rows hold their copies
        stopped = take_token(row.tokens, first, request.stop_ids, request.max_new_tokens, request.should_stop)
        if stopped is not None:
            self.stop(index, stopped, first)
        else:
            self.tokens[index] = first

    def decode(self, active: list[int]) -> None:
        """One decode step for every row; its wall time is split among the ``active`` rows."""
        start = time.perf_counter()
        self.tokens = self.step(self.batcher.slots, self.tokens, self.sampling).clone()
        drawn = self.tokens.tolist()  # the step's host synchronisation
        self.batcher.slots.check_step_attended()  # (and a second one, once the device is idle)
        elapsed = time.perf_counter() - start
        self.batcher.steps += 1
        self.batcher.step_seconds += elapsed
        for index in active:
            row = self.rows[index]
            row.decode_s += elapsed / len(active)
            row.fed += 1
            row.reselect(self.batcher.slots, index)  # between steps, as a single cache after the step
            if row.forced:  # its follow-up is being fed: what the step drew is not an answer's
                self.force(index)
                continue
            row.drawn += 1
            request = row.request
            stopped = take_token(
                row.tokens, drawn[index], request.stop_ids, request.max_new_tokens, request.should_stop
            )
            if stopped is not None:
                self.stop(index, stopped, drawn[index])

    def stop(self, index: int, stopped: str, last: int) -> None:
        """Row ``index``'s answer to its turn ended (``last``: the token drawn last): on to its next turn,
        or, with none left, finished."""
        row = self.rows[index]
        if not row.turns_left:
            self.finish(index, stopped)
            return
        row.next_turn(stopped, last)
        self.force(index)

    def force(self, index: int) -> None:
        """Write row ``index``'s next follow-up token as its input to the next step; before the last one,
        set its counter so that the step draws the next answer's first token with the counter of the
        row's draws so far (as :func:`~snapeval.decode.generation.generate` does)."""
        row = self.rows[index]
        self.tokens[index] = row.forced.popleft()
        if not row.forced:
            self.sampling.counter[index] = row.drawn - 1

    def finish(self, index: int, stopped: str) -> None:
        """Free row ``index``, hand its answer on, and queue first the requests it brings (a second pass)."""
        row = self.rows[index]
        self.rows[index] = None
        slots = self.batcher.slots
        answer = answer_of(slots, index, row, stopped)
        answer = across_ranks(answer, self.batcher.model, slots.parts[0].shapes.kv_heads)
        self.enqueue(list(self.on_answer(answer) or []), first=True)

    def pending(self) -> bool:
        """Whether a request waits, asking ``more`` for some when the queues are dry (until it has none)."""
        if not any(self.queues) and self.more is not None:
            self.enqueue(list(self.more()), first=False)
            self.more = self.more if any(self.queues) else None
        return any(self.queues)

    def enqueue(self, added: list[Request], first: bool) -> None:
        """Queue ``added`` (at the front when ``first``), growing the largest rows if one needs more."""
        batcher = self.batcher
        needs = [request.slots_needed for request in added]
        for request in added:
            check_kv_dtype(request, batcher.kv_dtype)
            self.shares[request.prefill_key()] += 1
            self.sampling.note(request.sampling)
            batcher.slots.admit(request.engine, len(request.prompt_ids))
        if added and max(needs) > batcher.slots.capacity:
            batcher.slots = batcher.slots.grown(max(needs))  # rare: a request longer than any reserved for
        pin_for_cuda_graphs([*self.sampling.tensors(), *batcher.slots.tensors()])  # grown, or rings admitted
        ordered = reversed(list(zip(added, needs, strict=True))) if first else zip(added, needs, strict=True)
        for request, need in ordered:
            queue = self.queues[batcher.slots.part_of(need)]
            if first:
                queue.appendleft(request)
            else:
                queue.append(request)
