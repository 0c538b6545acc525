"""The plain transformers peer in ``benchmarks/gpu.py``'s decode table, and the columns of its rows.

The peer decodes ``rows`` copies of the full-cache row's prompt greedily, one token per step after one
prefill, with transformers' own caches on the same model: eager over a ``DynamicCache`` (compile ``off``),
and over a ``StaticCache`` with the one-token forward compiled (any other compile mode: ``torch.compile``,
``reduce-overhead`` on CUDA, the default mode on a CPU). The model has the snapeval attention installed,
which with a transformers cache is exactly SDPA (``snapeval/cache/attention.py``), so what runs is plain
transformers. Each step reads its token back to the host, as the engine's step and ``generate`` do.
"""

from __future__ import annotations

import inspect
import time

import torch
from gpu_profile import StepProfile, synchronize
from transformers import DynamicCache, StaticCache

from snapeval.cache.attention import cache_keyword

WARM_STEPS = 3  # decode steps before timing (a CUDA graph is recorded on the second call)


def peers(modes: list[str]) -> list[tuple[str, str]]:
    """(decode name, compile mode) of the peers that ``modes`` (the engine's, timed) call for."""
    named = [("transformers DynamicCache", "off"), ("transformers StaticCache", "on")]
    wanted = {"off" if mode == "off" else "on" for mode in modes}
    return [(name, mode) for name, mode in named if mode in wanted]


@torch.inference_mode()
def decode_peer(
    model, ids: list[int], rows: int, steps: int, mode: str, bandwidth: float, profile: StepProfile | None
) -> list:
    """The decode table's columns for the peer in ``mode``, timed over ``steps`` steps; then, with a
    ``profile``, as many more under the profiler as it needs."""
    device, compiled = model.device, mode != "off"
    total = len(ids) + WARM_STEPS + steps + (profile.ticks_needed if profile else 0)
    start = time.perf_counter()
    cache, tokens = prefilled(model, ids, rows, total if compiled else None)
    step = one_token(model, cache, rows)
    if compiled:
        overhead = "reduce-overhead" if device.type == "cuda" else None
        step = torch.compile(step, fullgraph=True, dynamic=False, mode=overhead)
    position = torch.tensor([len(ids)], device=device)

    def advance() -> None:
        nonlocal tokens
        tokens = step(tokens, position).clone()
        tokens.tolist()  # the step's host synchronisation
        position.add_(1)

    for _ in range(WARM_STEPS):
        advance()
    warm = time.perf_counter() - start
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        advance()
    ms = 1000 * (time.perf_counter() - start) / steps
    kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    if profile is not None:
        with profile:
            for _ in range(profile.ticks_needed):
                advance()
                profile.tick()
    return columns(model, kv, rows, mode, warm, ms, bandwidth)


def prefilled(model, ids: list[int], rows: int, length: int | None) -> tuple:
    """One prefill of ``ids`` (one row, a ``DynamicCache``) and its greedy next token for ``rows`` rows,
    with the cache for ``rows`` rows: the ``DynamicCache`` repeated (``length`` None) or copied into a
    ``StaticCache`` of ``length`` slots (its prefill would build a mask as long as the cache per token)."""
    device, keyword = model.device, cache_keyword(model)
    cache = DynamicCache()
    prompt = torch.tensor([ids], device=device)
    logits = model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{keyword: cache}).logits
    tokens = logits[:, -1].argmax(-1).expand(rows).clone()
    if length is None:
        if rows > 1:
            cache.batch_repeat_interleave(rows)
        return cache, tokens
    static = StaticCache(config=model.config, max_cache_len=length)
    positions = {"cache_position": torch.arange(len(ids), device=device)}  # transformers < 5.24 reads it
    for index, layer in enumerate(cache.layers):
        rowed = (tensor.expand(rows, -1, -1, -1) for tensor in (layer.keys, layer.values))
        static.update(*rowed, index, positions)
    return static, tokens


def one_token(model, cache, rows: int):
    """The peer's step: every row's next greedy token after feeding ``tokens`` at ``position``."""
    keyword = cache_keyword(model)
    # transformers < 5.24 places a StaticCache's writes and mask by cache_position; 5.24 dropped it
    takes_position = "cache_position" in inspect.signature(model.forward).parameters

    def step(tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        logits = model(
            input_ids=tokens[:, None],
            position_ids=position.expand(rows, 1),
            use_cache=True,
            logits_to_keep=1,
            **{keyword: cache},
            **({"cache_position": position} if takes_position else {}),
        ).logits
        return logits[:, -1].argmax(-1)

    return step


def columns(model, kv: int, rows: int, mode: str, warm: float, ms: float, bandwidth: float) -> list:
    """A decode row after its context and name: KV MiB per row (``kv``: every row's held bytes), rows,
    compile, warm-up s, ms/step, tokens/s, the floor (the weights and ``kv`` read once at ``bandwidth``)
    and the step's ratio to it."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    floor_ms = 1000 * (weights + kv) / bandwidth
    return [
        f"{kv / rows / 2**20:,.1f}",
        rows,
        mode,
        f"{warm:.1f}",
        f"{ms:.2f}",
        f"{1000 * rows / ms:,.0f}",
        f"{floor_ms:.2f}",
        f"{ms / floor_ms:.1f}x",
    ]
