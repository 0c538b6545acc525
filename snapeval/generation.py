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
    return generate_draws(
        model, prompt_ids, cache, max_new_tokens, stop_ids, [sampling], compress_at, should_stop
    )[0]


@torch.inference_mode()
def generate_draws(
    model: PreTrainedModel,
    prompt_ids: Sequence[int],
    cache: Cache,
    max_new_tokens: int,
    stop_ids: set[int],
    samplings: Sequence[Sampling],
    compress_at: int | None = None,
    should_stop: Callable[[list[int]], bool] | None = None,
) -> list[Generation]:
    """Several answers to one prompt, decoded together: one per ``samplings`` entry.

    The prompt is prefilled (and compressed) once; the cache is then copied into one batch row per
    answer, and the rows decode as one batch, each sampling from its own seed and stopping on its own
    (as :func:`generate` describes). A row that has stopped rides along until all have. Each answer's
    seconds are the batch's divided by the number of answers, so that they add up to the wall time.
    """
    rows = len(samplings)
    device = model.device
    generators = [
        torch.Generator(device=device).manual_seed(s.seed) if s.do_sample else None for s in samplings
    ]
    start = time.perf_counter()
    last_logits = prompt_logits(model, prompt_ids, cache, compress_at)[-1]
    if rows > 1:
        cache.batch_repeat_interleave(rows)
    next_tokens = [_next_token(last_logits, s, g) for s, g in zip(samplings, generators, strict=True)]
    _synchronize(device)
    prefill_s = time.perf_counter() - start

    answers: list[list[int]] = [[] for _ in range(rows)]
    active = [True] * rows
    start = time.perf_counter()
    while True:
        for row, token in enumerate(next_tokens):
            if not active[row]:
                continue
            if token in stop_ids:
                active[row] = False
                continue
            answers[row].append(token)
            full = len(answers[row]) == max_new_tokens
            active[row] = not (full or (should_stop and should_stop(answers[row])))
        if not any(active):
            break
        step = torch.tensor([[token] for token in next_tokens], device=device)
        logits = model(input_ids=step, past_key_values=cache, use_cache=True).logits[:, -1]
        next_tokens = [
            _next_token(logits[row], samplings[row], generators[row]) if active[row] else next_tokens[row]
            for row in range(rows)
        ]
    _synchronize(device)
    decode_s = time.perf_counter() - start
    return [Generation(tokens, prefill_s / rows, decode_s / rows) for tokens in answers]


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
