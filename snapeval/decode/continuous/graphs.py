"""``run.compile=graphs``: the eager decode step captured as a CUDA graph and replayed.

A CUDA graph replays the kernels one eager step launched, at the addresses it saw, with no Python and no
launch cost: the compiled step's launch-free replays without inductor's compile wait (tens of seconds
per shape at 8B). The step already suits it: tensor operations only, no host synchronisation, and every
buffer it reads lives as long as its rows (the slot cache's, the sampling settings'). Only the tokens
change hands, copied into the captured input before each replay.

What a capture froze is its key (:func:`step_key`): the addresses and shapes of those buffers, and the
Python flags the step branches on (a row that samples, uses top-p, re-rotates sinks, re-selects while
decoding). A step whose key is new runs eagerly once (which warms up what capture needs) and is
captured; later steps with that key replay. New buffers (grown rows, another run) drop the old graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from snapeval.decode.continuous.classes import RowClasses
from snapeval.decode.continuous.rows import RowSampling

Step = Callable[[RowClasses, torch.Tensor, RowSampling], torch.Tensor]


class Captured(NamedTuple):
    """A captured step: ``replay()`` runs it on ``tokens`` (its input, written before each replay) and
    returns the next tokens."""

    replay: Callable[[], torch.Tensor]
    tokens: torch.Tensor


def capture_cuda(step: Step, slots: RowClasses, tokens: torch.Tensor, rows: RowSampling):
    """(the step captured as a ``torch.cuda.CUDAGraph``, the next tokens of this call's step): the step
    runs once on a side stream (PyTorch's warm-up before capture), then is recorded without running."""
    device = tokens.device
    static = tokens.clone()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        first = step(slots, static, rows)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step(slots, static, rows)

    def replay() -> torch.Tensor:
        graph.replay()
        return output

    return Captured(replay, static), first


def step_key(slots: RowClasses, rows: RowSampling) -> tuple[tuple, tuple]:
    """(the step's buffers' addresses and shapes, the Python flags it branches on): a capture replays
    only under the key it was captured with."""
    buffers = tuple((t.data_ptr(), tuple(t.shape)) for t in (*slots.tensors(), *rows.tensors()))
    flags = [(rows.sampling, rows.nucleus)]
    flags += [(part.sinks.any, part.recorder.active) for part in slots.parts]
    return buffers, tuple(flags)


class GraphedStep:
    """``step`` (the batcher's eager step) run as captured graphs, one per key (:func:`step_key`).

    ``capture(step, slots, tokens, rows)`` returns (a :class:`Captured`, this call's next tokens):
    :func:`capture_cuda` on a GPU; tests pass one that traces on CPU.
    """

    def __init__(self, step: Step, capture: Callable = capture_cuda) -> None:
        self.step, self.capture = step, capture
        self.buffers: tuple = ()
        self.captured: dict[tuple, Captured] = {}
        self.captures = 0

    def __call__(self, slots: RowClasses, tokens: torch.Tensor, rows: RowSampling) -> torch.Tensor:
        buffers, flags = step_key(slots, rows)
        if buffers != self.buffers:  # new rows: the old graphs read buffers that are gone
            self.buffers, self.captured = buffers, {}
        captured = self.captured.get(flags)
        if captured is None:
            self.captured[flags], first = self.capture(self.step, slots, tokens, rows)
            self.captures += 1
            return first
        captured.tokens.copy_(tokens)
        return captured.replay()
