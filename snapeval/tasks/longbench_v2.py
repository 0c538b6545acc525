"""LongBench-v2: the official prompts (THUDM/LongBench ``prompts/``), answer regexes and metrics.

Data: the Hub (``THUDM/LongBench-v2``), ``$SNAPEVAL_DATA_DIR/longbench_v2/longbench_v2_short.jsonl``, or
``task.metadata.data_path``. Config ``cot``: the two-pass CoT protocol's first (reasoning) prompt; its
answer call is ``task.answer_pass`` (:func:`build_cot_answer_prompt`). Option ``answer_from``:
``response`` (the whole output, as pred.py) or ``after_reasoning`` (after ``</think>``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from snapeval.configs.task import ANSWER_FROM
from snapeval.tasks.base import DataSource, Task, answer_part

LONGBENCH_V2 = DataSource(
    name="LongBench-v2",
    hub_id="THUDM/LongBench-v2",
    hub_split="train",
    local_path="longbench_v2/longbench_v2_short.jsonl",
    required=("_id", "question", "choice_A", "choice_B", "choice_C", "choice_D", "answer", "context"),
)

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
    """pred.py's chained replaces, in its order: a placeholder inside a value filled earlier (a
    ``$Q$`` in the document) is replaced too, and the reasoning, filled last, is left as it is."""
    text = template.replace("$DOC$", row["context"].strip()).replace("$Q$", row["question"].strip())
    for choice in "ABCD":
        text = text.replace(f"$C_{choice}$", row[f"choice_{choice}"].strip())
    return text.replace("$COT$", cot)


def extract_answer(response: str, answer_from: str = ANSWER_FROM[0]) -> str | None:
    """The chosen letter by the official regexes (markdown ``*`` removed; the first match of the first
    pattern that matches), in the whole response as pred.py reads it, or only after the reasoning."""
    text = answer_part(response, answer_from).replace("*", "")
    for pattern in _ANSWER_PATTERNS:
        if match := pattern.search(text):
            return match[1]
    return None


def score(
    response: str, row: Mapping[str, Any], answer_from: str = ANSWER_FROM[0]
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


class LongBenchV2(Task):
    """LongBench-v2 multiple choice; ``acc`` overall and per difficulty and length group."""

    names = ("longbench_v2", "longbench_v2_cot")
    metrics = ("acc", "acc_easy", "acc_hard", "acc_short", "acc_medium", "acc_long")
    id_field = "_id"
    source = LONGBENCH_V2

    def rows(self, tokenizer=None) -> list[dict]:
        return self.data_rows()

    def user_text(self, row) -> str:
        return build_prompt(row, cot=bool(self.config.get("cot")))

    def target(self, row) -> str:
        return row["answer"]

    def score_row(self, row, output: str) -> dict[str, float]:
        scored = score(output, row, self.metadata["answer_from"])
        acc = float(scored["acc"])
        return {"acc": acc, f"acc_{scored['difficulty']}": acc, f"acc_{scored['length']}": acc}
