"""Prefill, append and decode against any transformers cache: the prefill and append that the continuous
batcher and the lm-eval model share, and :func:`generate`, the one-by-one loop every batched path is
checked against. It knows nothing of compression; a snapeval cache compresses itself during prefill.

``compress_at`` splits a prompt: the tokens before it are prefilled in one call (and so compressed by a
compressing cache); the rest (the query, in query-agnostic evaluation) is appended afterwards.

Several turns on one context: after each answer but the last, its follow-up (:func:`forced_ids`: the
answer's last token unless the follow-up starts with it, then the follow-up's ids) is fed to the cache as
it stands, one token per step, and the next answer drawn from the last of them, as a chat engine with
prefix reuse serves a conversation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from snapeval.cache.attention import cache_keyword
from snapeval.cache.base import SnapevalCache
from snapeval.decode.sampling import Sampling, sample_one


@dataclass(frozen=True)
class Turn:
    """One turn's answer: its tokens, why it ended (eos | length | stop), and its decode seconds (feeding
    the follow-up before it included)."""

    tokens: tuple[int, ...]
    stopped: str
    decode_s: float


@dataclass(frozen=True)
class Generation:
    """One answer: its tokens, its seconds, and why it ended (eos | length | stop); with follow-ups, those
    of the last turn (``decode_s``: every turn's), and ``turns`` every turn's."""

    tokens: list[int]
    prefill_s: float
    decode_s: float
    stopped: str = "eos"
    turns: tuple[Turn, ...] = ()


def forced_ids(last: int, followup: Sequence[int]) -> list[int]:
    """What is fed between two answers: ``last``, the answer's last token drawn (not yet fed), unless the
    follow-up starts with it (an end of turn that the chat template writes too), then the ``followup``."""
    return list(followup) if followup[0] == last else [last, *followup]


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
    logits = prefill_logits(model, prompt_ids[:split], cache)
    appended = append_logits(model, prompt_ids[split:], cache)
    return logits if appended is None else torch.cat([logits, appended])


def prefill_logits(model: PreTrainedModel, prompt_ids: Sequence[int], cache: Cache) -> torch.Tensor:
    """(1, vocab) logits of the last of ``prompt_ids``, prefilled in one call (a snapeval cache, or a
    :class:`~snapeval.cache.grid.CacheGrid` of several, compresses itself during that call; a cache may
    first choose which prompt tokens to prefill, at their own positions), or in the chunks a snapeval
    cache's ``prefill_chunk`` asks for, one call each (:meth:`SnapevalCache.prefill_spans`)."""
    snapeval = isinstance(cache, SnapevalCache)
    ids, positions = cache.prefill_input(model, list(prompt_ids)) if snapeval else (prompt_ids, None)
    spans = cache.prefill_spans(len(ids)) if snapeval else [(0, len(ids))]
    for start, end in spans:
        piece = torch.tensor([list(ids[start:end])], device=model.device)
        extra = {cache_keyword(model): cache}
        if positions is not None:
            extra["position_ids"] = torch.tensor([positions[start:end]], device=model.device)
        logits = model(input_ids=piece, use_cache=True, logits_to_keep=1, **extra).logits[0]
    return logits


def append_logits(model: PreTrainedModel, token_ids: Sequence[int], cache: Cache) -> torch.Tensor | None:
    """(len(token_ids), vocab) logits of ``token_ids`` appended to a prefilled ``cache``, in chunks the
    cache can take; None when there is nothing to append."""
    rest = list(token_ids)
    chunk = _append_limit(cache) or len(rest) or 1
    logits, passing = [], {cache_keyword(model): cache}
    for start in range(0, len(rest), chunk):
        piece = torch.tensor([rest[start : start + chunk]], device=model.device)
        logits.append(model(input_ids=piece, use_cache=True, **passing).logits[0])
    return torch.cat(logits) if logits else None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (for honest wall times)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def take_token(
    tokens: list[int],
    token: int,
    stop_ids: set[int] | frozenset[int],
    max_new_tokens: int,
    should_stop: Callable[[list[int]], bool] | None,
) -> str | None:
    """Add a drawn ``token`` to an answer; returns why the answer ends here, or None to go on.

    ``eos``: a token of ``stop_ids`` (not kept); ``length``: ``max_new_tokens`` reached; ``stop``:
    ``should_stop(tokens)`` said so (tokens kept).
    """
    if token in stop_ids:
        return "eos"
    tokens.append(token)
    if len(tokens) >= max_new_tokens:
        return "length"
    if should_stop is not None and should_stop(tokens):
        return "stop"
    return None


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
    followups: Sequence[Sequence[int]] = (),
) -> Generation:
    """Prefill ``prompt_ids`` into ``cache``, then decode one token at a time: the plain reference path.

    Stops as :func:`take_token` says; with ``followups``, each turn after the first begins by feeding
    :func:`forced_ids` one token per step, and its ``max_new_tokens`` and stops start afresh. The ``k``-th
    token drawn (over every turn) is drawn as :func:`snapeval.decode.sampling.sample_one` draws it with
    counter ``k``, so every batched or compiled path can be checked against this one.
    """
    device = model.device
    start = time.perf_counter()
    logits = prompt_logits(model, prompt_ids, cache, compress_at)[-1]
    token = sample_one(logits, sampling, 0)
    synchronize(device)
    prefill_s = time.perf_counter() - start
    drawn, turns, passing = 1, [], {cache_keyword(model): cache}

    def step(fed: int) -> torch.Tensor:
        return model(input_ids=torch.tensor([[fed]], device=device), use_cache=True, **passing).logits[0, -1]

    for turn in range(len(followups) + 1):
        start = time.perf_counter()
        if turn:
            for fed in forced_ids(token, followups[turn - 1]):
                logits = step(fed)
            token, drawn = sample_one(logits, sampling, drawn), drawn + 1
        tokens: list[int] = []
        while (stopped := take_token(tokens, token, stop_ids, max_new_tokens, should_stop)) is None:
            token, drawn = sample_one(step(token), sampling, drawn), drawn + 1
        synchronize(device)
        turns.append(Turn(tuple(tokens), stopped, time.perf_counter() - start))
    decode_s = sum(turn.decode_s for turn in turns)
    return Generation(list(turns[-1].tokens), prefill_s, decode_s, turns[-1].stopped, tuple(turns))


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
