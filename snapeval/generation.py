"""The runner's own prefill/decode loop: one prompt, one cache, timings kept apart.

It drives any transformers causal LM through ``past_key_values`` and knows nothing of compression.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache


@dataclass(frozen=True)
class Sampling:
    """Greedy when ``do_sample`` is false; else temperature / nucleus sampling from ``seed``."""

    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class Generation:
    tokens: list[int]
    prefill_s: float
    decode_s: float


def _next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    if not sampling.do_sample:
        return int(logits.argmax())
    probabilities = (logits.float() / sampling.temperature).softmax(dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probabilities.sort(descending=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > sampling.top_p
        probabilities = torch.zeros_like(probabilities).scatter(
            0, order, sorted_probs.masked_fill(outside, 0.0)
        )
    return int(torch.multinomial(probabilities, 1, generator=generator))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    prompt_ids: list[int],
    cache: Cache,
    max_new_tokens: int,
    stop_ids: set[int],
    sampling: Sampling = Sampling(),
) -> Generation:
    """Prefill ``prompt_ids`` into ``cache``, then decode up to ``max_new_tokens`` (stop tokens excluded)."""
    device = model.device
    generator = torch.Generator(device=device).manual_seed(sampling.seed) if sampling.do_sample else None
    start = time.perf_counter()
    inputs = torch.tensor([prompt_ids], device=device)
    logits = model(input_ids=inputs, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    token = _next_token(logits, sampling, generator)
    _synchronize(device)
    prefill_s = time.perf_counter() - start

    tokens: list[int] = []
    start = time.perf_counter()
    while token not in stop_ids and len(tokens) < max_new_tokens:
        tokens.append(token)
        if len(tokens) == max_new_tokens:
            break
        step = torch.tensor([[token]], device=device)
        logits = model(input_ids=step, past_key_values=cache, use_cache=True).logits[0, -1]
        token = _next_token(logits, sampling, generator)
    _synchronize(device)
    return Generation(tokens=tokens, prefill_s=prefill_s, decode_s=time.perf_counter() - start)
