"""Continuous batching over fixed-shape slot caches, with a decode step that compiles once.

:class:`ContinuousBatcher` owns ``rows`` decode rows in capacity classes
(:class:`~snapeval.decode.continuous.classes.RowClasses`: one :class:`~snapeval.cache.slots.SlotCache` per
class, each as wide as its requests need; allocated for a run's requests, reused by later runs while wide
enough, and grown for a longer one) and a queue of :class:`Request` s per class. Whenever a row is free,
the next request of its class (else of the nearest smaller one) is loaded into it from its prompt's
prefill. Requests with the same prompt share one prefill: the draws of one problem, and the points of a
sweep grid, whose caches (each compressing itself) are all filled from that one prefill by a
:class:`~snapeval.cache.grid.CacheGrid`. Then one decode step advances every row by one token. A row that
stops frees its slot for the next request at once: the batch never waits for its longest row. The queue
may be topped up while it runs (``run(..., more=...)``): the runner claims samples from the results
database as rows free, so that workers on one point split it. A request of several turns on one context
(``Request.followups``) keeps its row from turn to turn: each follow-up is fed one token per decode step,
as a chat engine with prefix reuse appends a conversation's next message.

The decode step (tokens of every row -> next token of every row, sampling included) performs no host
synchronisation and no branch on tensor values; :meth:`ContinuousBatcher.step` may be compiled
(``torch.compile(fullgraph=True, dynamic=False)``, CUDA graphs on a GPU), and then runs every step of a
run, refills, ring wrap-around and re-selections included, from one graph while the rows keep their
shapes; or its eager step is captured as CUDA graphs as it is (``run.compile=graphs``). The loop reads the
new tokens once per step to decide which rows stop.

Every answer equals the one-by-one :func:`snapeval.decode.generation.generate` (the same tokens; sampled rows
draw their ``k``-th token from their own seed and counter ``k``, whatever row or batch they run in).
Seconds are honest per answer: its prefill (shared prefills split among their draws) and, per step,
the step's wall time divided among the rows that were decoding.

Modules: :mod:`~snapeval.decode.continuous.work` (a request and its answer),
:mod:`~snapeval.decode.continuous.prefills` (one prefill shared by the requests of a prompt),
:mod:`~snapeval.decode.continuous.classes` (the rows in capacity classes, each attended over its own slots),
:mod:`~snapeval.decode.continuous.rows` (what each row holds, its sampling settings as tensors),
:mod:`~snapeval.decode.continuous.compiled` (``run.compile`` and the CUDA graph's fixed addresses),
:mod:`~snapeval.decode.continuous.graphs` (``run.compile=graphs``: the eager step captured as CUDA graphs),
:mod:`~snapeval.decode.continuous.batcher` (the decode step and the run's loop).
"""

from snapeval.decode.continuous.batcher import ContinuousBatcher
from snapeval.decode.continuous.compiled import COMPILE_MODES, check_compile, step_mode
from snapeval.decode.continuous.work import Answer, Request

__all__ = ["COMPILE_MODES", "Answer", "ContinuousBatcher", "Request", "check_compile", "step_mode"]
