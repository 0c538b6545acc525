"""One prefill per prompt, shared by every request of that prompt (draws, and the points of a grid)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from snapeval.cache import SnapevalCache
from snapeval.cache.grid import CacheGrid
from snapeval.decode.continuous.work import Request
from snapeval.decode.generation import append_logits, prefill_logits, synchronize


@dataclass
class Prefill:
    """One prompt's prefill: a filled cache and first-token logits per setting, and seconds per request."""

    caches: dict[tuple, SnapevalCache] = field(default_factory=dict)
    logits: dict[tuple, torch.Tensor] = field(default_factory=dict)
    seconds: dict[tuple, float] = field(default_factory=dict)

    def release(self) -> None:
        """Every row of the prompt is loaded (each holds its copy): its caches drop what they held."""
        for cache in self.caches.values():
            cache.release()


def fill(model: PreTrainedModel, request: Request, queue: Iterable[Request], prefill: Prefill) -> None:
    """Fill ``prefill`` with a cache for every setting that ``request`` and the queued requests of
    its prompt ask for and it lacks, from one prefill call; its seconds are split among them. A setting's
    cache is the engine of its first request (:attr:`Request.engine`; a request builds no other): the
    setting's other requests (draws) load their rows from it."""
    key = request.prefill_key()
    group = [request, *(other for other in queue if other.prefill_key() == key)]
    caches: dict[tuple, SnapevalCache] = {}
    for other in group:
        if other.setting not in prefill.caches:
            caches.setdefault(other.setting, other.engine)
    for cache in caches.values():
        cache.release()  # a request run before prefills its engine afresh
    shared = next(iter(caches.values())) if len(caches) == 1 else CacheGrid(list(caches.values()))
    split = request.compress_at or len(request.prompt_ids)
    start = time.perf_counter()
    logits = prefill_logits(model, request.prompt_ids[:split], shared)[-1]
    for setting, cache in caches.items():  # the query of a query-agnostic prompt, per cache
        appended = append_logits(model, request.prompt_ids[split:], cache)
        prefill.logits[setting] = logits if appended is None else appended[-1]
    synchronize(model.device)
    share = (time.perf_counter() - start) / sum(other.setting in caches for other in group)
    prefill.caches.update(caches)
    prefill.seconds.update(dict.fromkeys(caches, share))
