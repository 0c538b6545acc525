"""LongBench-v2: the official prompts (THUDM/LongBench ``prompts/``), answer regexes and metrics."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from snapeval.benchmarks import answer_part
from snapeval.prompting import truncate_middle  # noqa: F401  (part of this module's protocol)

TEMPLATE_0SHOT = (
    "Please read the following text and answer the question below.\n\n"
    "<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    'Format your response as follows: "The correct answer is (insert answer here)".'
)
TEMPLATE_COT = (
    "Please read the following text and answer the questions below.\n\n"
    "<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    "Let\u2019s think step by step:"
)
TEMPLATE_COT_ANSWER = (
    "Please read the following text and answer the questions below.\n\n"
    "The text is too long and omitted here.\n\n"
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    "Let\u2019s think step by step: $COT$\n\n"
    "Based on the above, what is the single, most likely answer choice? "
    'Format your response as follows: "The correct answer is (insert answer here)".'
)

_PLACEHOLDER = re.compile(r"\$(?:DOC|Q|C_[A-D]|COT)\$")
_ANSWER_PATTERNS = (
    re.compile(r"The correct answer is \(([A-D])\)"),
    re.compile(r"The correct answer is ([A-D])"),
)
GROUPS = {"difficulty": ("easy", "hard"), "length": ("short", "medium", "long")}


def build_prompt(row: Mapping[str, Any], *, cot: bool = False) -> str:
    """The 0-shot prompt, or with ``cot`` the first (reasoning) pass of the CoT protocol."""
    return _fill(TEMPLATE_COT if cot else TEMPLATE_0SHOT, row)


def build_cot_answer_prompt(row: Mapping[str, Any], reasoning: str) -> str:
    """The second CoT pass: the question and the first pass's reasoning, without the document."""
    return _fill(TEMPLATE_COT_ANSWER, row, reasoning.strip())


def _fill(template: str, row: Mapping[str, Any], cot: str = "") -> str:
    # One pass, so that a "$Q$" inside the document or the reasoning is left alone.
    values = {
        "$DOC$": row["context"].strip(),
        "$Q$": row["question"].strip(),
        **{f"$C_{c}$": row[f"choice_{c}"].strip() for c in "ABCD"},
        "$COT$": cot,
    }
    return _PLACEHOLDER.sub(lambda m: values[m[0]], template)


def extract_answer(response: str, answer_from: str = "response") -> str | None:
    """The chosen letter by the official regexes (markdown ``*`` removed; the first match of the first
    pattern that matches), in the whole response as pred.py reads it, or only after the reasoning."""
    text = answer_part(response, answer_from).replace("*", "")
    for pattern in _ANSWER_PATTERNS:
        if match := pattern.search(text):
            return match[1]
    return None


def score(
    response: str, row: Mapping[str, Any], answer_from: str = "response"
) -> dict[str, int | str | None]:
    """``acc`` (0/1), the extracted ``pred``, and the item's ``difficulty`` and ``length``."""
    pred = extract_answer(response, answer_from)
    return {"acc": int(pred == row["answer"]), "pred": pred, **{key: row[key] for key in GROUPS}}


def summarize(scored: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """Mean accuracy overall and per difficulty and length group (None for an empty group)."""
    scored = list(scored)

    def mean(rows: list[Mapping[str, Any]]) -> float | None:
        return sum(row["acc"] for row in rows) / len(rows) if rows else None

    summary = {"overall": mean(scored)}
    for key, groups in GROUPS.items():
        summary |= {group: mean([row for row in scored if row[key] == group]) for group in groups}
    return summary
