"""The batcher's unit of work: a :class:`Request` to answer and the :class:`Answer` it becomes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from snapeval.cache import CacheSetting, SnapevalCache, build_cache
from snapeval.decode.generation import Turn
from snapeval.decode.sampling import Sampling


@dataclass(frozen=True)
class Request:
    """One answer to generate: a prompt, the cache setting to compress it with, and how to stop.

    ``compress_at``: the prompt tokens before it are prefilled (and compressed) in one call, the rest
    appended. ``followups``: several turns on one context: the ids fed after each answer but the last
    (the end of its turn, the next user message and the assistant header, as the chat template renders
    them; :func:`~snapeval.decode.generation.forced_ids`), each turn answered in at most
    ``max_new_tokens``. ``tag``: anything the caller needs back with the answer.
    """

    prompt_ids: tuple[int, ...]
    cache: CacheSetting | Mapping[str, Any]
    max_new_tokens: int
    sampling: Sampling = Sampling()
    stop_ids: frozenset[int] = frozenset()
    compress_at: int | None = None
    should_stop: Callable[[list[int]], bool] | None = None
    tag: Any = None
    followups: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        """A cache given as a node (``{"method": ..., **parameters}``) is made a setting here; follow-ups
        are tuples, none of them empty."""
        object.__setattr__(self, "cache", CacheSetting.of(self.cache))
        object.__setattr__(self, "followups", tuple(tuple(ids) for ids in self.followups))
        if not all(self.followups):
            raise ValueError("a follow-up turn must feed at least one token")

    def prefill_key(self) -> tuple:
        """Requests with equal keys share one prefill, whatever their cache settings (except a method
        that chooses what to prefill, or prefills in chunks: its prefill is its own)."""
        return self._prefill_key

    @cached_property
    def _prefill_key(self) -> tuple:
        own = self.engine.prefills_alone
        return (self.prompt_ids, self.compress_at, self.setting if own else None)

    @property
    def new_tokens(self) -> int:
        """The most tokens a row feeds after its prompt: every turn's answer and every follow-up."""
        fed = sum(len(ids) for ids in self.followups)
        return (1 + len(self.followups)) * self.max_new_tokens + fed

    @cached_property
    def slots_needed(self) -> int:
        """The slots of one row that the request fills: its compressed prompt, query and answers (worked
        out once: the batcher sizes its rows and places the request by it)."""
        split = self.compress_at or len(self.prompt_ids)
        appended = len(self.prompt_ids) - split
        return self.engine.decode_slots(split, appended + self.new_tokens)

    @cached_property
    def engine(self) -> SnapevalCache:
        """The request's one cache, built once: its row's slots, its admission and its decode-time
        re-selections; the first request of a prompt and setting is also prefilled into it, and the
        setting's other requests of that prompt load their rows from it
        (:func:`~snapeval.decode.continuous.prefills.fill`)."""
        return build_cache(self.cache)

    @property
    def setting(self) -> tuple:
        """The key of the request's cache setting (parameters a method ignores left out)."""
        return self.cache.key


@dataclass
class Answer:
    """A finished request: its tokens, why it stopped, and what it cost. A request of several turns:
    ``tokens`` and ``stopped`` are its last turn's, ``decode_s`` every turn's, and ``turns`` each turn's
    (a one-turn answer's one turn is made of ``tokens``, ``stopped`` and ``decode_s``)."""

    request: Request
    tokens: list[int]
    stopped: str  # eos | length | stop
    prefill_s: float
    decode_s: float
    kv_bytes: int | None  # the row's own slots (a growing method: those it filled), over every rank under
    # TP; None where a deployed engine answered (what its cache held is not known here)
    ring_wraps: int  # times the row's ring came round to its first slot while decoding
    kept_histogram: dict[str, list[float]] | None  # compressed methods: share of the prompt held per bin
    kept_share: float | None = None  # compressed methods: share of the prompt held
    evictions: tuple[int, ...] = ()  # decode steps (tokens generated) at which the row was re-selected
    kept_generated_share: float | None = (
        None  # compressed methods: share of the tokens fed while decoding held
    )
    row: int | None = None  # the batch row it decoded in
    kv_bytes_per_rank: int | None = None  # the share of kv_bytes one rank held (None: kv_bytes, one device)
    turns: tuple[Turn, ...] = ()

    def __post_init__(self) -> None:
        if self.kv_bytes_per_rank is None:
            self.kv_bytes_per_rank = self.kv_bytes
        if not self.turns:
            self.turns = (Turn(tuple(self.tokens), self.stopped, self.decode_s),)
