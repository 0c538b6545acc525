"""The one way a prompt becomes a request of the continuous batcher, for the runner and the lm-eval model.

A prompt (a task's chat messages, or lm-eval's context text) is cut to fit the model's window with room
for the answer, encoded, split where its query starts (query-agnostic compression), and wrapped in a
:class:`~snapeval.decode.continuous.Request` with its sampling seed and the token ids and strings that end it.
A sample of several turns also carries the ids fed after each answer but the last
(:func:`~snapeval.run.prompting.followup_texts`, encoded without special tokens added); the window then
leaves room for every turn's answer and follow-up.

The runner cuts the middle of the last message's text (``task.truncation``) before encoding; the
lm-eval model, whose context is one finished text, cuts the middle of its ids (``cut_ids``, as LongBench's
``pred.py`` cuts a prompt's ids), giving up the query split of a context that had to be cut.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from snapeval.configs.setting import CacheSetting
from snapeval.decode.continuous import Request
from snapeval.decode.sampling import Sampling
from snapeval.decode.stops import StopCheck, stop_check
from snapeval.run.prompting import (
    PromptInput,
    encode_with_split,
    fit_to_window,
    followup_texts,
    too_long,
    truncate_content,
    truncate_middle,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from snapeval.tasks import Task


def sample_seed(seed: int, sample_id: str) -> int:
    """The sampling seed of sample ``sample_id`` (a draw ``<id>#<k>``, an answer pass ``<id>#answer``)
    in a run of ``seed``: the same whatever batch or worker draws it."""
    return seed * 1_000_003 + zlib.crc32(sample_id.encode())


def sampling(generation: Mapping[str, Any], seed: int) -> Sampling:
    """How a request draws: ``do_sample``, ``temperature`` and ``top_p`` of ``generation`` (the
    ``generation`` config, or lm-eval's ``gen_kwargs``; unset: greedy, 1.0, 1.0) with ``seed``."""
    return Sampling(
        do_sample=bool(generation.get("do_sample", False)),
        temperature=float(generation.get("temperature") or 1.0),
        top_p=float(generation.get("top_p") or 1.0),
        seed=seed,
    )


class RequestBuilder:
    """Requests for one tokenizer and window: prompt -> fitted ids -> query split -> :class:`Request`.

    ``window``: tokens the prompt and its answer may take together. ``truncation``: ``error`` refuses a
    prompt that does not fit, ``middle`` cuts its middle: the last message's text (after
    ``max_prompt_tokens``, LongBench's budget on that text), or with ``cut_ids`` the prompt's ids after
    the split. ``query_start``: where the query starts (None: the whole prompt is compressed).
    ``stop_ids``: tokens that end every answer. The last prompt's encoding is kept, so the draws and
    cache settings of one problem encode it once.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        window: int,
        stop_ids: frozenset[int],
        truncation: str = "error",
        cut_ids: bool = False,
        max_prompt_tokens: int | None = None,
        query_start: str | None = None,
    ) -> None:
        self.tokenizer, self.window, self.stop_ids = tokenizer, window, stop_ids
        self.truncation, self.cut_ids = truncation, cut_ids
        self.max_prompt_tokens, self.query_start = max_prompt_tokens, query_start
        self._last: tuple[Any, tuple[tuple[int, ...], int | None]] | None = None
        self._followups: tuple[Any, tuple[tuple[int, ...], ...]] | None = None
        self._stop_checks: dict[tuple[str, ...], StopCheck | None] = {}

    @classmethod
    def for_task(
        cls, tokenizer: PreTrainedTokenizerBase, task: Task, window: int, stop_ids: frozenset[int]
    ) -> RequestBuilder:
        """The runner's builder: the task's truncation, prompt budget and query start."""
        return cls(
            tokenizer,
            window,
            stop_ids,
            truncation=task.truncation,
            max_prompt_tokens=task.max_prompt_tokens,
            query_start=task.query_start,
        )

    def request(
        self,
        prompt: PromptInput,
        max_new_tokens: int,
        cache: CacheSetting,
        sampling: Sampling,
        stops: Sequence[str] = (),
        tag: Any = None,
        followups: Sequence[str] = (),
    ) -> Request:
        """The request answering ``prompt`` in at most ``max_new_tokens`` under ``cache`` (a cache
        setting), ending at :attr:`stop_ids` or once the answer holds one of ``stops``; then each of the
        ``followups`` questions in turn, on the same cache, each answer as long and ending alike."""
        fed = self.followup_ids(prompt, tuple(followups))
        reserved = (1 + len(fed)) * max_new_tokens + sum(len(ids) for ids in fed)
        ids, compress_at = self.encode(prompt, reserved)
        stops = tuple(stops)
        if stops not in self._stop_checks:
            self._stop_checks[stops] = stop_check(self.tokenizer, stops)
        should_stop = self._stop_checks[stops]
        return Request(
            ids, cache, max_new_tokens, sampling, self.stop_ids, compress_at, should_stop, tag, followups=fed
        )

    def encode(self, prompt: PromptInput, reserved: int) -> tuple[tuple[int, ...], int | None]:
        """The prompt's ids, fitted to leave ``reserved`` tokens of the window (its answers and
        follow-ups), and where its query starts (None: all of it is compressed at prefill)."""
        key = (_frozen(prompt), reserved)
        if self._last is None or self._last[0] != key:
            self._last = (key, self._encode(prompt, self.window - reserved))
        return self._last[1]

    def followup_ids(self, prompt: PromptInput, questions: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """The ids fed after each answer to ``prompt`` but the last, one per follow-up question (the last
        sample's kept: its draws and cache settings render them once)."""
        if not questions:
            return ()
        key = (_frozen(prompt), questions)
        if self._followups is None or self._followups[0] != key:
            texts = followup_texts(self.tokenizer, prompt, questions)
            ids = (self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts)
            self._followups = (key, tuple(tuple(each) for each in ids))
        return self._followups[1]

    def split(self, prompt: PromptInput) -> tuple[list[int], int | None]:
        """The prompt's ids as they are, and where its query starts."""
        return encode_with_split(self.tokenizer, prompt, self.query_start)

    def _encode(self, prompt: PromptInput, room: int) -> tuple[tuple[int, ...], int | None]:
        if self.max_prompt_tokens:
            prompt = truncate_content(self.tokenizer, prompt, self.max_prompt_tokens)
        if not self.cut_ids:
            prompt = fit_to_window(self.tokenizer, prompt, room, self.truncation)
        ids, compress_at = self.split(prompt)
        if self.cut_ids and len(ids) > room:
            if self.truncation != "middle":
                raise too_long(len(ids) - room)
            ids, compress_at = truncate_middle(ids, room), None
        return tuple(ids), compress_at


def _frozen(prompt: PromptInput) -> Any:
    """``prompt`` as a hashable value (equal prompts, equal values)."""
    if isinstance(prompt, str):
        return prompt
    return tuple(tuple(sorted(message.items())) for message in prompt)
