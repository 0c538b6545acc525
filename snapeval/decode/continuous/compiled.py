"""``run.compile``: how the decode step runs (eager, compiled, CUDA graphs) and the buffers a CUDA graph
reads in place."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from snapeval.configs.root import COMPILE_MODES
from snapeval.errors import SnapevalError


def check_compile(mode: str) -> None:
    """Reject a ``run.compile`` value that is not one of :data:`COMPILE_MODES`."""
    if mode not in COMPILE_MODES:
        raise SnapevalError(f"choose one of {', '.join(COMPILE_MODES)}, got {mode!r}", "run.compile")


def step_mode(mode: str, device: torch.device) -> str:
    """How ``run.compile`` = ``mode`` runs the decode step on ``device``: ``eager``, ``compiled`` or
    ``graphs`` (:mod:`~snapeval.decode.continuous.graphs`, refused off CUDA in one line).

    ``auto`` compiles on CUDA (where CUDA graphs remove the launch overhead that dominates a decode
    step) and not on CPU, where compiling takes minutes and gains little (see benchmarks/README.md).
    """
    check_compile(mode)
    if mode == "graphs" and device.type != "cuda":
        raise SnapevalError(f"CUDA graphs need a CUDA device, the model is on {device.type}", "run.compile")
    if mode == "on" or (mode == "auto" and device.type == "cuda"):
        return "compiled"
    return "graphs" if mode == "graphs" else "eager"


def compile_step(step: Callable, device: torch.device) -> Callable:
    """``step`` as one graph; on CUDA also captured as a CUDA graph (``reduce-overhead``)."""
    mode = "reduce-overhead" if device.type == "cuda" else None
    return torch.compile(step, fullgraph=True, dynamic=False, mode=mode)


def pin_for_cuda_graphs(tensors: Iterable[torch.Tensor]) -> None:
    """Tell torch.compile that these buffers keep their address, so a CUDA graph reads them in place
    instead of copying them in at every replay (a no-op off CUDA)."""
    for tensor in tensors:
        if tensor.device.type == "cuda":
            torch._dynamo.mark_static_address(tensor)
