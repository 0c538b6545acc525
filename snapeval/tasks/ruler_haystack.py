"""The haystacks of the RULER tasks: repeated noise sentences, or plain prose sentences of CPython's
bundled documentation (no network), each with its token length, and how needles are woven in."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pydoc_data.topics import topics
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

HaystackSource = Literal["noise", "prose"]

NOISE = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)


@dataclass(frozen=True)
class Needle:
    """A sentence to hide, at a relative depth (0 start, 1 end) of the haystack."""

    text: str
    depth: float


@dataclass(frozen=True)
class Haystack:
    """Sentences to fill a context with, and the token count of each (with its leading space)."""

    sentences: tuple[str, ...]
    lengths: tuple[int, ...]

    def fill(self, start: int, budget: int) -> list[str]:
        """Sentences in order from ``start``, wrapping around, adding up to at most ``budget`` tokens.

        A sentence that would overflow is passed over for a later, shorter one, so the total lands
        within a short sentence of the budget.
        """
        taken: list[str] = []
        index, misses = start, 0
        while misses < len(self.sentences):
            if self.lengths[index] <= budget:
                taken.append(self.sentences[index])
                budget -= self.lengths[index]
                misses = 0
            else:
                misses += 1
            index = (index + 1) % len(self.sentences)
        return taken


_PLAIN_SENTENCE = re.compile(r"[A-Z](?:[\w ,;:'\"()“”‘’—-]|\.(?=\w))*[\w)\"”’]\.")
_BULLET = re.compile(r"^\s*(?:\*|\d+\.)\s+")
_EMPHASIS = re.compile(r"\*(\S[^*]*?)\*")
_FOOTNOTE = re.compile(r"\s*\[\d+\]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_LONG_NUMBER = re.compile(r"\d{3}")


def _is_plain_sentence(sentence: str) -> bool:
    """Prose, not code or a heading, of reasonable length, and with no number a needle could be taken for."""
    return (
        20 <= len(sentence) <= 250
        and _PLAIN_SENTENCE.fullmatch(sentence) is not None
        and _LONG_NUMBER.search(sentence) is None
    )


@cache
def prose_sentences() -> tuple[str, ...]:
    """Distinct plain sentences of CPython's documentation topics, in topic order (about 37k tokens)."""
    sentences: dict[str, None] = {}
    for name in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[name]):
            text = " ".join(_FOOTNOTE.sub("", _EMPHASIS.sub(r"\1", _BULLET.sub("", paragraph))).split())
            sentences.update(dict.fromkeys(s for s in _SENTENCE_END.split(text) if _is_plain_sentence(s)))
    return tuple(sentences)


@lru_cache(maxsize=8)
def haystack(tokenizer: PreTrainedTokenizerBase, source: HaystackSource) -> Haystack:
    """The sentences of ``source`` and their token lengths under ``tokenizer`` (cached)."""
    sentences = NOISE if source == "noise" else prose_sentences()
    ids = tokenizer([f" {s}" for s in sentences], add_special_tokens=False)["input_ids"]
    return Haystack(sentences, tuple(len(i) for i in ids))


def weave(sentences: Sequence[str], needles: Sequence[Needle]) -> str:
    """The haystack text with each needle between sentences at its depth; ties keep the needles' order."""
    pieces = list(sentences)
    slots = sorted(((round(n.depth * len(sentences)), i) for i, n in enumerate(needles)), reverse=True)
    for position, i in slots:
        pieces.insert(position, needles[i].text)
    return " ".join(pieces)
