"""Turn a task's chat messages into model input: fit the window, and mark where compression happens."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from snapeval.errors import SnapevalError
from snapeval.models import encode_chat
from snapeval.tasks.base import RAW_ROLE

TRUNCATIONS = ("error", "middle")


def fit_to_window(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], max_tokens: int, truncation: str
) -> list[dict[str, str]]:
    """Messages whose encoding takes at most ``max_tokens``.

    ``middle`` drops tokens from the middle of the last message, keeping its head and tail as LongBench's
    official ``pred.py`` does; ``error`` refuses a prompt that does not fit.
    """
    excess = len(prompt_ids(tokenizer, messages)) - max_tokens
    if excess <= 0:
        return messages
    if truncation != "middle":
        raise SnapevalError(
            f"a prompt is {excess} tokens longer than the model's window minus max_new_tokens; "
            "shorten it or set task.truncation=middle",
            "task.truncation",
        )
    content = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
    keep = len(content) - excess
    if keep <= 1:
        raise SnapevalError(
            "the model's window cannot hold even the prompt's template", "task.max_new_tokens"
        )
    head, tail = content[: keep // 2], content[len(content) - (keep - keep // 2) :]
    text = tokenizer.decode(head) + tokenizer.decode(tail)
    return [*messages[:-1], {**messages[-1], "content": text}]


def truncate_content(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], max_tokens: int
) -> list[dict[str, str]]:
    """LongBench's ``pred.py`` budget: the last message's text, encoded as pred.py encodes it (special
    tokens included), keeps at most ``max_tokens`` tokens, cut in the middle and decoded without special
    tokens; the chat template comes around it afterwards."""
    ids = tokenizer.encode(messages[-1]["content"])
    if len(ids) <= max_tokens:
        return messages
    text = tokenizer.decode(truncate_middle(ids, max_tokens), skip_special_tokens=True)
    return [*messages[:-1], {**messages[-1], "content": text}]


def encode_with_split(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], query_start: str | None
) -> tuple[list[int], int | None]:
    """Token ids of the chat prompt and, when ``query_start`` occurs in it, the index where the query
    begins: the tokens before it are compressed at prefill, the query is appended after (query-agnostic)."""
    if not query_start:
        return prompt_ids(tokenizer, messages), None
    text = prompt_text(tokenizer, messages)
    cut = text.rfind(query_start)
    if cut <= 0:
        return prompt_ids(tokenizer, messages), None
    context = tokenizer(text[:cut], add_special_tokens=False)["input_ids"]
    query = tokenizer(text[cut:], add_special_tokens=False)["input_ids"]
    return context + query, len(context)


def is_raw(messages: list[dict[str, str]]) -> bool:
    """Whether ``messages`` is one finished prompt text (a :data:`~snapeval.tasks.base.RAW_ROLE` message)."""
    return len(messages) == 1 and messages[0]["role"] == RAW_ROLE


def prompt_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    """The prompt as text: the chat template around ``messages``, or a raw prompt as it is."""
    if is_raw(messages):
        return messages[0]["content"]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the prompt. A raw prompt is tokenized as vLLM tokenizes a text prompt (lcb_runner's
    generation): with the tokenizer's special tokens, so a tokenizer that adds a BOS adds it again."""
    if is_raw(messages):
        return tokenizer(messages[0]["content"])["input_ids"]
    return encode_chat(tokenizer, messages)


def truncate_middle(token_ids: Sequence[int], max_len: int) -> list[int]:
    """At most ``max_len`` tokens: the first ``max_len // 2`` and the rest from the end (as pred.py)."""
    if max_len < 1:
        raise ValueError(f"max_len must be positive, got {max_len}")
    if len(token_ids) <= max_len:
        return list(token_ids)
    head = max_len // 2
    return [*token_ids[:head], *token_ids[len(token_ids) - (max_len - head) :]]
