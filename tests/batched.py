"""The batcher's answers to a queue of requests, each checked against the same request decoded alone
(:func:`snapeval.decode.generation.generate` on a fresh cache): the equality every fast path must keep."""

from __future__ import annotations

from snapeval.cache import build_cache
from snapeval.decode.continuous import Answer, ContinuousBatcher, Request
from snapeval.decode.generation import generate


def alone(model, request: Request) -> list[int]:
    """The tokens of ``request`` decoded on its own."""
    cache = build_cache(request.cache)
    prompt = list(request.prompt_ids)
    stops = set(request.stop_ids)
    return generate(model, prompt, cache, request.max_new_tokens, stops, request.sampling).tokens


def answers_equal_alone(model, requests: list[Request], rows: int = 3) -> dict:
    """Answer ``requests`` in ``rows`` refilled rows (a prompt's settings sharing one prefill); every
    answer's tokens must be its request's alone. Returns the answers by tag."""
    got: dict[object, Answer] = {}
    ContinuousBatcher(model, rows).run(requests, lambda answer: got.__setitem__(answer.request.tag, answer))
    for request in requests:
        assert got[request.tag].tokens == alone(model, request), request.cache
    return got
