"""Fitting prompts to the window (LongBench's middle truncation) and the query-agnostic split."""

from __future__ import annotations

import pytest

from snapeval.errors import SnapevalError
from snapeval.models import encode_chat
from snapeval.run.prompting import encode_with_split, fit_to_window, truncate_content
from tests.families import smollm2_tokenizer

DOCUMENT = " ".join(f"Sentence number {i} of the document." for i in range(200))


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer alone (no weights)."""
    return smollm2_tokenizer()


def test_middle_truncation_keeps_head_and_tail_within_the_window(tokenizer):
    messages = [{"role": "user", "content": f"BEGIN {DOCUMENT} END"}]
    fitted = fit_to_window(tokenizer, messages, 300, "middle")
    assert len(encode_chat(tokenizer, fitted)) <= 300
    content = fitted[0]["content"]
    assert content.startswith("BEGIN Sentence number 0") and content.endswith(
        "number 199 of the document. END"
    )
    assert "number 100 of" not in content


def test_overlong_prompt_without_truncation_is_an_error(tokenizer):
    with pytest.raises(SnapevalError, match="task.truncation"):
        fit_to_window(tokenizer, [{"role": "user", "content": DOCUMENT}], 300, "error")


def test_query_agnostic_split_falls_where_the_query_starts(tokenizer):
    messages = [{"role": "user", "content": f"{DOCUMENT}\n\nWhat is the correct answer to this question: x?"}]
    ids, split = encode_with_split(tokenizer, messages, "What is the correct answer")
    assert tokenizer.decode(ids[split:]).startswith("What is the correct answer to this question: x?")
    assert tokenizer.decode(ids[:split]).rstrip().endswith("number 199 of the document.")
    assert encode_with_split(tokenizer, messages, None) == (encode_chat(tokenizer, messages), None)


def test_protocol_budget_cuts_the_prompt_text_as_pred_py(tokenizer):
    """``task.max_prompt_tokens``: the text, encoded as pred.py encodes it, keeps its first budget // 2
    tokens and its last budget - budget // 2, decoded without special tokens; the template comes after."""
    text = f"BEGIN {DOCUMENT} END"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    ids = tokenizer.encode(text)
    cut = truncate_content(tokenizer, messages, 301)
    assert cut[0] == messages[0]
    assert cut[1]["content"] == tokenizer.decode(ids[:150] + ids[-151:], skip_special_tokens=True)
    assert cut[1]["content"].startswith("BEGIN Sentence number 0")
    assert cut[1]["content"].endswith("number 199 of the document. END")
    assert abs(len(tokenizer.encode(cut[1]["content"])) - 301) <= 2  # re-encoding a cut may merge tokens
    assert truncate_content(tokenizer, messages, len(ids)) == messages


def test_a_prompt_text_is_cut_as_a_last_message_is(tokenizer):
    """A finished text (lm-eval's context) is fitted and budgeted as the last message's text would be."""
    text = f"BEGIN {DOCUMENT} END"
    messages = [{"role": "user", "content": text}]
    fitted = fit_to_window(tokenizer, text, 300, "middle")
    template = len(encode_chat(tokenizer, messages)) - len(
        tokenizer(text, add_special_tokens=False)["input_ids"]
    )
    assert fitted == fit_to_window(tokenizer, messages, 300 + template, "middle")[0]["content"]
    assert fitted.startswith("BEGIN Sentence number 0") and fitted.endswith("document. END")
    assert len(tokenizer(fitted, add_special_tokens=False)["input_ids"]) <= 300
    assert truncate_content(tokenizer, text, 301) == truncate_content(tokenizer, messages, 301)[0]["content"]
