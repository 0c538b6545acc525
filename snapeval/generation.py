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
    answer, and the rows decode as one batch (see :func:`_decode`). Each answer's seconds are the
    batch's divided by the number of answers, so that they add up to the wall time.
    """
    rows = len(samplings)
    generators = _generators(samplings, model.device)
    start = time.perf_counter()
    last_logits = prompt_logits(model, prompt_ids, cache, compress_at)[-1]
    if rows > 1:
        cache.batch_repeat_interleave(rows)
    first = [_next_token(last_logits, s, g) for s, g in zip(samplings, generators, strict=True)]
    _synchronize(model.device)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    answers = _decode(model, cache, first, samplings, generators, max_new_tokens, stop_ids, should_stop)
    decode_s = time.perf_counter() - start
    return [Generation(tokens, prefill_s / rows, decode_s / rows) for tokens in answers]


@torch.inference_mode()
def generate_batch(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    cache: Cache,
    max_new_tokens: int,
    stop_ids: set[int],
    samplings: Sequence[Sampling],
    pad_token_id: int,
    should_stop: Callable[[list[int]], bool] | None = None,
) -> list[Generation]:
    """Answers to several prompts, decoded together: one per prompt, ``samplings[i]`` for ``prompts[i]``.

    The prompts are left-padded to one width and prefilled in one call (a snapeval cache never keeps
    the padding); every row then decodes at its own positions (see :func:`_decode`). Each answer's
    seconds are the batch's divided by its size.
    """
    device, width = model.device, max(map(len, prompts))
    input_ids = torch.tensor([[pad_token_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    generators = _generators(samplings, device)
    start = time.perf_counter()
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    first = [
        _next_token(logits[row], s, g) for row, (s, g) in enumerate(zip(samplings, generators, strict=True))
    ]
    _synchronize(device)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    answers = _decode(
        model,
        cache,
        first,
        samplings,
        generators,
        max_new_tokens,
        stop_ids,
        should_stop,
        next_positions=positions[:, -1] + 1,
    )
    decode_s = time.perf_counter() - start
    return [Generation(tokens, prefill_s / len(prompts), decode_s / len(prompts)) for tokens in answers]


def _generators(samplings: Sequence[Sampling], device: torch.device) -> list[torch.Generator | None]:
    return [torch.Generator(device=device).manual_seed(s.seed) if s.do_sample else None for s in samplings]


def _decode(
    model: PreTrainedModel,
    cache: Cache,
    next_tokens: list[int],
    samplings: Sequence[Sampling],
    generators: Sequence[torch.Generator | None],
    max_new_tokens: int,
    stop_ids: set[int],
    should_stop: Callable[[list[int]], bool] | None = None,
    next_positions: torch.Tensor | None = None,
) -> list[list[int]]:
    """Decode every row of ``cache`` from its first token until all rows have stopped.

    A row stops at a token of ``stop_ids`` (not kept), after ``max_new_tokens`` tokens, or when
    ``should_stop(tokens)`` says so (tokens kept); a row that has stopped rides along until all have.
    Each row samples from its own generator. ``next_positions`` (rows,) gives each row's next RoPE
    position (left-padded rows); by default the cache's length decides, the same for every row.
    """
    rows, device = len(next_tokens), model.device
    answers: list[list[int]] = [[] for _ in range(rows)]
    active = [True] * rows
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
        positions = {} if next_positions is None else {"position_ids": next_positions[:, None]}
        logits = model(input_ids=step, past_key_values=cache, use_cache=True, **positions).logits[:, -1]
        if next_positions is not None:
            next_positions = next_positions + 1
        next_tokens = [
            _next_token(logits[row], samplings[row], generators[row]) if active[row] else next_tokens[row]
            for row in range(rows)
        ]
    _synchronize(device)
    return answers


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
