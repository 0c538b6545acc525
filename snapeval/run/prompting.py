"""Turn a prompt into model input: fit the window, mark where compression happens, and render the text
fed between the answers of several turns on one context.

A prompt is a task's chat messages, or a finished prompt text (lm-eval's contexts, encoded as they are).
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from snapeval.errors import SnapevalError
from snapeval.models import encode_chat, plain_text
from snapeval.tasks.base import RAW_ROLE

Messages = list[dict[str, str]]
PromptInput = Messages | str
"""Chat messages (a :data:`~snapeval.tasks.base.RAW_ROLE` message is a raw prompt), or a prompt text."""
ANSWER_MARK = "[[snapeval:answer]]"
"""What stands for an answer when a conversation is rendered to find the text the template puts after it."""


def fit_to_window(
    tokenizer: PreTrainedTokenizerBase, prompt: PromptInput, max_tokens: int, truncation: str
) -> PromptInput:
    """The prompt, its encoding cut to at most ``max_tokens``.

    ``middle`` drops tokens from the middle of the last message (of the text), keeping its head and tail
    as LongBench's official ``pred.py`` does; ``error`` refuses a prompt that does not fit.
    """
    excess = len(prompt_ids(tokenizer, prompt)) - max_tokens
    if excess <= 0:
        return prompt
    if truncation != "middle":
        raise too_long(excess)
    content = tokenizer(last_text(prompt), add_special_tokens=False)["input_ids"]
    keep = len(content) - excess
    if keep <= 1:
        raise SnapevalError(
            "the model's window cannot hold even the prompt's template", "task.max_new_tokens"
        )
    head, tail = content[: keep // 2], content[len(content) - (keep - keep // 2) :]
    return with_last_text(prompt, tokenizer.decode(head) + tokenizer.decode(tail))


def too_long(excess: int) -> SnapevalError:
    """The error of a prompt ``excess`` tokens too long under ``task.truncation=error``."""
    return SnapevalError(
        f"a prompt is {excess} tokens longer than the model's window minus max_new_tokens; "
        "shorten it or set task.truncation=middle",
        "task.truncation",
    )


def truncate_content(tokenizer: PreTrainedTokenizerBase, prompt: PromptInput, max_tokens: int) -> PromptInput:
    """LongBench's ``pred.py`` budget: the last message's text, encoded as pred.py encodes it (special
    tokens included), keeps at most ``max_tokens`` tokens, cut in the middle and decoded without special
    tokens; the chat template comes around it afterwards."""
    ids = tokenizer.encode(last_text(prompt))
    if len(ids) <= max_tokens:
        return prompt
    return with_last_text(
        prompt, tokenizer.decode(truncate_middle(ids, max_tokens), skip_special_tokens=True)
    )


def encode_with_split(
    tokenizer: PreTrainedTokenizerBase, prompt: PromptInput, query_start: str | None
) -> tuple[list[int], int | None]:
    """Token ids of the prompt and, when ``query_start`` occurs in it after its start, the index where the
    query begins: the tokens before it are compressed at prefill, the query is appended after
    (query-agnostic)."""
    if not query_start:
        return prompt_ids(tokenizer, prompt), None
    text = prompt_text(tokenizer, prompt)
    cut = text.rfind(query_start)
    if cut <= 0:
        return prompt_ids(tokenizer, prompt), None
    context = tokenizer(text[:cut], add_special_tokens=False)["input_ids"]
    query = tokenizer(text[cut:], add_special_tokens=False)["input_ids"]
    return context + query, len(context)


def followup_texts(
    tokenizer: PreTrainedTokenizerBase, prompt: PromptInput, questions: Sequence[str]
) -> list[str]:
    """The text fed after each answer but the last, one per follow-up question: what the chat template
    writes after an assistant answer through the next user message and the generation prompt (the
    conversation so far rendered with :data:`ANSWER_MARK` for each answer, taken after the last one);
    for a base model (no template), a raw prompt or a text, the question between blank lines."""
    if isinstance(prompt, str) or is_raw(prompt) or not tokenizer.chat_template:
        return [f"\n\n{question}\n\n" for question in questions]
    texts, conversation = [], list(prompt)
    for question in questions:
        conversation += [{"role": "assistant", "content": ANSWER_MARK}, {"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        cut = text.rfind(ANSWER_MARK)
        if cut < 0:
            raise SnapevalError(
                "the model's chat template does not write an earlier answer back, so a follow-up turn "
                "cannot extend the cache that holds it; run a one-turn task with this model",
                "task.name",
            )
        texts.append(text[cut + len(ANSWER_MARK) :])
    return texts


def is_raw(prompt: PromptInput) -> bool:
    """Whether ``prompt`` is one finished prompt text (a :data:`~snapeval.tasks.base.RAW_ROLE` message)."""
    return not isinstance(prompt, str) and len(prompt) == 1 and prompt[0]["role"] == RAW_ROLE


def prompt_text(tokenizer: PreTrainedTokenizerBase, prompt: PromptInput) -> str:
    """The prompt as text: the chat template around the messages, or a raw prompt or text as it is."""
    if isinstance(prompt, str):
        return prompt
    if is_raw(prompt):
        return prompt[0]["content"]
    if not tokenizer.chat_template:  # a base model: the messages as they are
        return plain_text(prompt)
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: PromptInput) -> list[int]:
    """Token ids of the prompt. A raw prompt is tokenized as vLLM tokenizes a text prompt (lcb_runner's
    generation): with the tokenizer's special tokens, so a tokenizer that adds a BOS adds it again. A
    text is tokenized as lm-eval's Hugging Face model tokenizes a context: without them."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if is_raw(prompt):
        return tokenizer(prompt[0]["content"])["input_ids"]
    return encode_chat(tokenizer, prompt)


def last_text(prompt: PromptInput) -> str:
    """The text a truncation cuts: the last message's content, or the whole text."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def with_last_text(prompt: PromptInput, text: str) -> PromptInput:
    """``prompt`` with :func:`last_text` replaced by ``text``."""
    if isinstance(prompt, str):
        return text
    return [*prompt[:-1], {**prompt[-1], "content": text}]


def truncate_middle(token_ids: Sequence[int], max_len: int) -> list[int]:
    """At most ``max_len`` tokens: the first ``max_len // 2`` and the rest from the end (as pred.py)."""
    if max_len < 1:
        raise ValueError(f"max_len must be positive, got {max_len}")
    if len(token_ids) <= max_len:
        return list(token_ids)
    head = max_len // 2
    return [*token_ids[:head], *token_ids[len(token_ids) - (max_len - head) :]]
