"""Prefill, append and decode against any transformers cache: the loop shared by the runner and the
lm-eval adapter. It knows nothing of compression; a snapeval cache compresses itself during prefill.

``compress_at`` splits a prompt: the tokens before it are prefilled in one call (and so compressed by a
compressing cache); the rest (the query, in query-agnostic evaluation) is appended afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
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


def _append_limit(cache: Cache) -> int | None:
    limit = getattr(cache, "append_limit", None)
    return limit() if callable(limit) else None


def prompt_logits(
    model: PreTrainedModel, prompt_ids: Sequence[int], cache: Cache, compress_at: int | None = None
) -> torch.Tensor:
    """(len(prompt) - start, vocab) logits of the prompt positions from ``compress_at`` on (the last one
    alone when there is no split): the prefix is prefilled in one call, the rest appended in chunks the
    cache can take."""
    split = compress_at or len(prompt_ids)
    device = model.device
    prefix = torch.tensor([list(prompt_ids[:split])], device=device)
    logits = [model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0]]
    rest = list(prompt_ids[split:])
    chunk = _append_limit(cache) or len(rest) or 1
    for start in range(0, len(rest), chunk):
        piece = torch.tensor([rest[start : start + chunk]], device=device)
        logits.append(model(input_ids=piece, past_key_values=cache, use_cache=True).logits[0])
    return torch.cat(logits)


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
    prompt_ids: Sequence[int],
    cache: Cache,
    max_new_tokens: int,
    stop_ids: set[int],
    sampling: Sampling = Sampling(),
    compress_at: int | None = None,
    should_stop: Callable[[list[int]], bool] | None = None,
) -> Generation:
    """Prefill ``prompt_ids`` into ``cache``, then decode up to ``max_new_tokens`` tokens.

    Stops at a token of ``stop_ids`` (not kept) or when ``should_stop(tokens)`` says so (tokens kept).
    """
    device = model.device
    generator = torch.Generator(device=device).manual_seed(sampling.seed) if sampling.do_sample else None
    start = time.perf_counter()
    token = _next_token(prompt_logits(model, prompt_ids, cache, compress_at)[-1], sampling, generator)
    _synchronize(device)
    prefill_s = time.perf_counter() - start

    tokens: list[int] = []
    start = time.perf_counter()
    while token not in stop_ids:
        tokens.append(token)
        if len(tokens) == max_new_tokens or (should_stop and should_stop(tokens)):
            break
        step = torch.tensor([[token]], device=device)
        logits = model(input_ids=step, past_key_values=cache, use_cache=True).logits[0, -1]
        token = _next_token(logits, sampling, generator)
    _synchronize(device)
    return Generation(tokens=tokens, prefill_s=prefill_s, decode_s=time.perf_counter() - start)


@torch.inference_mode()
def continuation_logprob(
    model: PreTrainedModel,
    context_ids: Sequence[int],
    continuation_ids: Sequence[int],
    cache: Cache,
    compress_at: int | None = None,
) -> tuple[float, bool]:
    """Log-probability of ``continuation_ids`` after ``context_ids`` scored against ``cache``, which
    holds the (compressed) context; and whether greedy decoding would produce the continuation."""
    split = compress_at or len(context_ids)
    sequence = list(context_ids) + list(continuation_ids)[:-1]
    logits = prompt_logits(model, sequence, cache, split)  # positions split-1 .. end
    scored = logits[len(context_ids) - split :].float().log_softmax(dim=-1)
    target = torch.tensor(list(continuation_ids), device=scored.device)
    logprob = float(scored.gather(-1, target[:, None]).sum())
    return logprob, bool((scored.argmax(dim=-1) == target).all())
