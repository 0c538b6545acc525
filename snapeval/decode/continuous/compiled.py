"""``run.compile``: how the decode step runs (eager, compiled, CUDA graphs) and the buffers a CUDA graph
reads in place."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from snapeval.configs.root import COMPILE_MODES, DECODE_ATTENTIONS
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


def check_decode_attention(choice: str) -> None:
    """Reject a ``run.decode_attention`` value that is not one of :data:`DECODE_ATTENTIONS`."""
    if choice not in DECODE_ATTENTIONS:
        raise SnapevalError(
            f"choose one of {', '.join(DECODE_ATTENTIONS)}, got {choice!r}", "run.decode_attention"
        )


def splits_decode(choice: str, device: torch.device, programs: int) -> bool:
    """Whether ``run.decode_attention`` = ``choice`` attends a decode token with the split-KV attention
    (:func:`~snapeval.cache.decode_attention.split_decode_attention`) for ``programs`` = rows x KV heads.

    ``auto`` splits on CUDA when the fused SDPA kernel, one program per (row, KV head), would leave
    streaming multiprocessors idle (fewer programs than the device has: 8 at 1 row of Llama-3.1-8B on an
    H100's 132); grouped SDPA otherwise, and always on CPU. benchmarks/gpu.py times both.
    """
    check_decode_attention(choice)
    if choice != "auto":
        return choice == "split"
    if device.type != "cuda":
        return False
    return programs < torch.cuda.get_device_properties(device).multi_processor_count


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
