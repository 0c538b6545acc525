"""What ends an answer, for the runner and the lm-eval model alike: its stop ids (:func:`stop_ids`), and
stop strings: generation ends once the decoded answer holds one (as vLLM's ``stop``), and the text from
the first one on is not the answer (:func:`cut_at_stop`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import GenerationConfig, PreTrainedTokenizerBase

StopCheck = Callable[[list[int]], bool]


def stop_ids(tokenizer: PreTrainedTokenizerBase, generation: GenerationConfig | None) -> frozenset[int]:
    """The token ids that end every answer (the token is not kept): the tokenizer's EOS id and every EOS id
    of the model's ``generation`` config (one id or a list, as ``model.generate`` stops on: an instruct
    model's end of turn, such as Llama 3's ``<|eot_id|>``, is often listed there and not the tokenizer's
    EOS). The runner and the lm-eval model both stop on this set."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(generation, "eos_token_id", None)):
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return frozenset(ids)


def stop_check(tokenizer: PreTrainedTokenizerBase, stops: Iterable[str]) -> StopCheck | None:
    """A ``should_stop(tokens)`` that is true once the decoded tokens end in text holding a stop string
    (the last few tokens are decoded, enough to hold the longest one), or None without stop strings."""
    stops = [stop for stop in stops if stop]
    if not stops:
        return None
    window = max(len(tokenizer(stop, add_special_tokens=False)["input_ids"]) for stop in stops) + 4

    def should_stop(tokens: list[int]) -> bool:
        tail = tokenizer.decode(tokens[-window:], skip_special_tokens=True)
        return any(stop in tail for stop in stops)

    return should_stop


def cut_at_stop(text: str, stops: Iterable[str]) -> str:
    """``text`` up to the first occurrence of any stop string (vLLM returns the answer without it)."""
    cut = min((index for stop in stops if stop and (index := text.find(stop)) >= 0), default=len(text))
    return text[:cut]
