"""``run.compile=graphs`` (snapeval/decode/continuous/graphs.py): the eager step captured once per key and
replayed gives the eager step's tokens, token for token; a changed flag or new buffers capture again; on
CPU the mode is refused in one line.

A CUDA graph needs a GPU, so here the capture is traced instead (``make_fx``, real tensors): like a CUDA
graph it runs the step once, then replays the recorded ops on the same buffers with every Python flag as
it was at capture, so a key that missed a flag replays a stale step and the tokens differ. The CUDA
capture itself runs in ``benchmarks/gpu.py`` (graphs == eager, token for token).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from snapeval.cache import install
from snapeval.decode.continuous import ContinuousBatcher
from snapeval.decode.continuous import batcher as batcher_module
from snapeval.decode.continuous.graphs import Captured, GraphedStep
from snapeval.errors import SnapevalError
from tests.families import FAMILIES
from tests.test_continuous import SNAPSTREAM, random_requests
from tests.test_continuous import tiny as tiny  # noqa: F401  (the module's model fixture)
from tests.test_decode_eviction import TOY

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def capture_traced(step, slots, tokens, rows):
    """The CPU stand-in for :func:`~snapeval.decode.continuous.graphs.capture_cuda`."""
    static, first = tokens.clone(), []
    graph = make_fx(lambda given: first.append(step(slots, given, rows)) or first[-1])(static)
    return Captured(lambda: graph(static), static), first[0]


def run(model, requests, rows, graphs: bool, monkeypatch, more=None):
    """{tag: tokens}, and the GraphedStep of the run (None: eager)."""
    made = []

    def graphed(step):
        made.append(GraphedStep(step, capture_traced))
        return made[-1]

    monkeypatch.setattr(batcher_module, "GraphedStep", graphed)
    batcher = ContinuousBatcher(model, rows, "off")
    batcher.mode = "graphs" if graphs else "eager"  # CPU refuses the mode: the traced capture stands in
    got = {}
    batcher.run(requests, lambda answer: got.__setitem__(answer.request.tag, answer.tokens), more)
    return got, (made[0] if made else None), batcher


def test_graphs_give_the_eager_tokens_from_one_capture(tiny, monkeypatch):
    """A mixed queue (8 methods, greedy and sampled rows, rings that wrap, re-rotated sinks, rows re-selected
    while decoding) through 3 refilled rows: one capture, then replays only."""
    requests = random_requests(16, max_new=50, seed=5)
    toy = {"method": TOY, "budget": 90, "buffer": 10, "every": 5}
    requests = [replace(r, cache=toy) if n % 4 == 3 else r for n, r in enumerate(requests)]
    eager, _, _ = run(tiny, requests, 3, False, monkeypatch)
    graphs, graphed, batcher = run(tiny, requests, 3, True, monkeypatch)
    assert graphs == eager
    assert graphed.captures == 1
    assert batcher.steps >= 100


def test_a_flag_that_changes_mid_run_captures_again(tiny, monkeypatch):
    """Greedy rows first; then, as the queue runs dry, sampled rows with top-p and re-rotated sinks
    arrive: the step's flags change, so it is captured again (3 keys in all), and still equals eager."""
    greedy = random_requests(6, max_new=30, seed=6)
    caches = [SNAPSTREAM, {"method": "full"}]
    greedy = [
        replace(r, cache=caches[n % 2], sampling=replace(r.sampling, do_sample=False))
        for n, r in enumerate(greedy)
    ]
    sampled = [replace(r, cache=SNAPSTREAM, tag=f"s{r.tag}") for r in random_requests(4, max_new=30, seed=7)]
    rerotated = {"method": "streaming_llm", "budget": 20, "sinks": 2, "rerotate": True}
    later = [[], [replace(r, cache=rerotated, tag=f"r{r.tag}") for r in sampled[:2]], sampled]

    def more_of(batches):
        return lambda: batches.pop() if batches else []

    eager, _, _ = run(tiny, greedy, 2, False, monkeypatch, more_of(list(later)))
    graphs, graphed, _ = run(tiny, greedy, 2, True, monkeypatch, more_of(list(later)))
    assert len(graphs) == 12 and graphs == eager
    assert graphed.captures == 3  # greedy; sampled (top-p); sampled with re-rotated sinks


def test_a_later_run_replays_the_first_runs_capture(tiny, monkeypatch):
    """The batcher keeps its rows, sampling settings and captures across runs (the runner's groups, a
    search's rounds): a second run with the same flags replays without capturing, and equals eager."""
    monkeypatch.setattr(batcher_module, "GraphedStep", functools.partial(GraphedStep, capture=capture_traced))
    first, second = random_requests(6, max_new=20, seed=10), random_requests(6, max_new=20, seed=11)
    first, second = ([replace(r, cache=SNAPSTREAM) for r in batch] for batch in (first, second))
    batcher = ContinuousBatcher(tiny, 2, "off")
    batcher.mode = "graphs"  # CPU refuses the mode: the traced capture stands in
    got = []
    for batch in (first, second):
        batcher.run(batch, lambda answer: got.append(answer.tokens))
    eager, _, _ = run(tiny, first, 2, False, monkeypatch)
    later, _, _ = run(tiny, second, 2, False, monkeypatch)
    assert sorted(got) == sorted([*eager.values(), *later.values()])
    assert batcher.graphed.captures == 1


def test_graphs_are_refused_on_cpu_in_one_line(tiny):
    with pytest.raises(SnapevalError, match="CUDA graphs need a CUDA device") as error:
        ContinuousBatcher(tiny, 2, "graphs")
    assert error.value.field == "run.compile"
    assert "\n" not in str(error.value)


def test_a_capture_is_dropped_with_the_buffers_it_read():
    """New buffers (grown rows, a new run) mean the old graphs read memory that is gone."""
    steps = []
    graphed = GraphedStep(lambda *args: steps.append(args) or torch.zeros(1), functools.partial(fake_capture))
    first, second = FakeRows(), FakeRows()
    for rows in (first, first, second, first):
        graphed(rows, torch.zeros(1), rows)
    assert graphed.captures == 3  # first, second, first again (its graph was dropped with the switch)


class FakeRows:
    """What :func:`step_key` reads of the rows and their sampling settings."""

    def __init__(self) -> None:
        self.buffer = torch.zeros(2)
        self.parts, self.sampling, self.nucleus = [], False, False

    def tensors(self) -> list[torch.Tensor]:
        return [self.buffer]


def fake_capture(step, slots, tokens, rows):
    return Captured(lambda: step(slots, tokens, rows), tokens.clone()), step(slots, tokens, rows)


SYNCING = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique_consecutive"}
"""Ops that read a tensor's values back to the host: a CUDA graph cannot capture them."""


class HostReads(TorchDispatchMode):
    """The ops that read tensor values back to the host (:data:`SYNCING`), in call order."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func.overloadpacket) in SYNCING:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3"])
def test_an_eager_step_reads_nothing_back_to_the_host(family, monkeypatch):
    """What CUDA-graph capture of the eager step needs (transformers' eager code paths may differ from the
    compiled ones): sampled and top-p rows, re-rotated sinks and rows re-selected while decoding, on a
    full-attention, a sliding-window and a QK-norm family."""
    model = install(FAMILIES[family](320))
    requests = random_requests(6, max_new=12, seed=8)
    toy = {"method": TOY, "budget": 90, "buffer": 10, "every": 5}
    requests = [replace(r, cache=toy) if n % 3 == 2 else r for n, r in enumerate(requests)]
    batcher = ContinuousBatcher(model, 3, "off")
    original, modes = batcher.step, []

    def step(*args):
        with HostReads() as mode:
            tokens = original(*args)
        modes.append(mode)
        return tokens

    batcher.step = step
    batcher.run(requests, lambda answer: None)
    assert len(modes) >= 10
    assert [mode.seen for mode in modes if mode.seen] == []
