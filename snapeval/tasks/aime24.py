"""AIME 2024: the DeepSeek-R1 / QwQ evaluation prompt, scored by an official harness's scorer.

Data: the Hub (``HuggingFaceH4/aime_2024``), ``$SNAPEVAL_DATA_DIR/aime24/test.jsonl``, or
``task.metadata.data_path``. ``task.scorer``: one of :data:`~snapeval.configs.task.AIME_SCORERS`,
``qwen_math`` (Qwen2.5-Math's grader, the reference) by default (:mod:`snapeval.tasks.aime_scorers`).
Option ``answer_from``: ``response`` (the whole output, as every official scorer reads it) or
``after_reasoning`` (the text after ``</think>``). A row's gold ``answer`` is an AIME answer, an integer
0-999 (or its digits, "025"); any other row is refused when the data is read, never scored 0.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

from snapeval.configs.task import AIME_SCORERS, ANSWER_FROM
from snapeval.errors import SnapevalError
from snapeval.tasks import qwen_math_grader
from snapeval.tasks.aime_scorers import SCORERS
from snapeval.tasks.base import DataSource, Task, answer_part, short_repr

AIME24 = DataSource(
    name="AIME 2024",
    hub_id="HuggingFaceH4/aime_2024",
    hub_split="train",
    local_path="aime24/test.jsonl",
    required=("problem", "answer"),
)

PROMPT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def build_prompt(problem: str) -> str:
    """The user prompt for one problem (the DeepSeek-R1 / QwQ evaluation style)."""
    return PROMPT_TEMPLATE.format(problem=problem)


def score(
    output: str, gold: str, scorer: str = AIME_SCORERS[0], answer_from: str = ANSWER_FROM[0]
) -> dict[str, int]:
    """``acc`` (0/1) of one output by the named scorer, over the whole ``response`` (as every official
    scorer reads it) or only the text ``after_reasoning``."""
    if scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}; choose one of {', '.join(SCORERS)}")
    if scorer == "lm_eval" and gold.isdigit():
        gold = str(int(gold))  # lm-eval's aime24 data (Maxwell-Jia/AIME_2024) holds integers: "25", not "025"
    return {"acc": int(SCORERS[scorer](answer_part(output, answer_from), gold))}


def gold_problem(answer: Any) -> str | None:
    """Why ``answer`` is no AIME gold answer (None: an integer 0-999, or a string of 1-3 digits)."""
    if isinstance(answer, numbers.Integral) and not isinstance(answer, bool) and 0 <= int(answer) <= 999:
        return None
    if isinstance(answer, str) and re.fullmatch(r"[0-9]{1,3}", answer):
        return None
    return f"answer must be an integer 0-999 or a string of one (AIME), got {short_repr(answer)}"


def pass_at_1(accs: Sequence[Sequence[float]]) -> float:
    """pass@1 over problems: each problem's mean accuracy over its samples, averaged."""
    if not accs or any(not samples for samples in accs):
        raise ValueError("pass@1 needs at least one problem and one sample per problem")
    return sum(sum(samples) / len(samples) for samples in accs) / len(accs)


class Aime24(Task):
    """AIME 2024, 30 problems; ``acc`` is 1 when the scorer (``task.scorer``) accepts the output."""

    names = ("aime24",)
    metrics = ("acc",)
    id_field = "id"
    source = AIME24

    def __init__(self, cfg, seed: int = 0, limit: int | None = None) -> None:
        super().__init__(cfg, seed, limit)
        self.scorer: str = self.config["scorer"]
        if self.scorer not in SCORERS:
            message = f"unknown scorer {self.scorer!r}; choose one of {', '.join(SCORERS)}"
            raise SnapevalError(message, "task.scorer")
        # Qwen2.5-Math's grader deviates in its parsers whatever the preset (README "Protocols")
        self.deviations = qwen_math_grader.DEVIATIONS if self.scorer == "qwen_math" else ()

    def rows(self, tokenizer=None) -> list[dict]:
        return self.data_rows()

    def row_problem(self, row: Mapping[str, Any]) -> str | None:
        return gold_problem(row["answer"])

    def user_text(self, row) -> str:
        return build_prompt(row["problem"])

    def target(self, row) -> str:
        return row["answer"]

    def score_row(self, row, output: str) -> dict[str, float]:
        scored = score(output, str(row["answer"]), self.scorer, self.metadata["answer_from"])
        return {"acc": float(scored["acc"])}
