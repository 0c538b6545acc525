"""AIME 2024: the DeepSeek-R1 / QwQ evaluation prompt, the last ``\\boxed{}`` answer, math-verify.

Data: the Hub (``HuggingFaceH4/aime_2024``), ``$SNAPEVAL_DATA_DIR/aime24/test.jsonl``, or
``task.metadata.data_path``. Option ``answer_from``: ``after_reasoning`` (the last box after
``</think>``, snapeval's default) or ``response`` (anywhere, as Qwen2.5-Math's evaluation reads it).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

from math_verify import parse, verify

from snapeval.tasks.base import DataSource, Task, answer_part, load_rows

AIME24 = DataSource(
    name="AIME 2024",
    hub_id="HuggingFaceH4/aime_2024",
    hub_split="train",
    local_path="aime24/test.jsonl",
    required=("problem", "answer"),
)

PROMPT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_MATH_VERIFY_TIMEOUT_S = 5


def build_prompt(problem: str) -> str:
    """The user prompt for one problem (the DeepSeek-R1 / QwQ evaluation style)."""
    return PROMPT_TEMPLATE.format(problem=problem)


def extract_answer(text: str, answer_from: str = "after_reasoning") -> str | None:
    """The content of the last ``\\boxed{...}`` or ``\\fbox{...}`` after any reasoning trace (or, with
    ``answer_from="response"``, in the whole output, as Qwen2.5-Math's evaluation reads it).

    Braces nest. None when there is no box, or the last one is empty or never closed (a truncated
    output: an earlier box is an intermediate result, not the answer).
    """
    text = answer_part(text, answer_from)
    boxes = list(_BOX.finditer(text))
    if not boxes:
        return None
    start = boxes[-1].end()
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip() or None
    return None


def is_equivalent(pred: str, gold: str) -> bool:
    """Whether ``pred`` equals ``gold`` mathematically ("25", "025", "25 \\text{ cm}", "25^\\circ")."""
    # math_verify's timeouts use SIGALRM, which only the main thread may install.
    timeout = _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
    pred_parsed = parse(f"\\boxed{{{pred}}}", parsing_timeout=timeout)
    return bool(gold_parsed and pred_parsed) and verify(gold_parsed, pred_parsed, timeout_seconds=timeout)


def score(output: str, gold: str, answer_from: str = "after_reasoning") -> dict[str, int | str | None]:
    """``acc`` (0/1) and the extracted answer ``pred`` of one model output."""
    pred = extract_answer(output, answer_from)
    return {"acc": int(pred is not None and is_equivalent(pred, gold)), "pred": pred}


def pass_at_1(accs: Sequence[Sequence[float]]) -> float:
    """pass@1 over problems: each problem's mean accuracy over its samples, averaged."""
    if not accs or any(not samples for samples in accs):
        raise ValueError("pass@1 needs at least one problem and one sample per problem")
    return sum(sum(samples) / len(samples) for samples in accs) / len(accs)


class Aime24(Task):
    """AIME 2024, 30 problems; ``acc`` is 1 when the extracted answer equals the gold integer."""

    names = ("aime24",)
    metrics = ("acc",)
    options = {"answer_from": ("after_reasoning", "response")}
    id_field = "id"

    def rows(self, tokenizer=None) -> list[dict]:
        return load_rows(AIME24, self.metadata.get("data_path"))

    def user_text(self, row) -> str:
        return build_prompt(row["problem"])

    def target(self, row) -> str:
        return row["answer"]

    def score_row(self, row, output: str) -> dict[str, float]:
        return {"acc": float(score(output, str(row["answer"]), self.metadata["answer_from"])["acc"])}
