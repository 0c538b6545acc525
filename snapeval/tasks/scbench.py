"""SCBench (Li et al., 2024): several questions asked of one shared context, turn by turn (its multi-turn
mode), on the subsets whose answers are strings (``task.metadata.subset``, one of ``SCBENCH_SUBSETS``).

Data: ``hf://datasets/microsoft/SCBench/data/<subset>.jsonl`` (the files SCBench's own harness reads),
``$SNAPEVAL_DATA_DIR/scbench/<subset>.jsonl``, or ``task.metadata.data_path``; each row holds ``id``,
``context`` and ``multi_turns``, a list of ``{"input", "answer"}``. The first turn is the subset's template
around the context and the first input, each later turn its input alone (as SCBench's follow-ups in a chat
template: ``scbench_qa_eng`` wraps it as ``Question: ...\\nAnswer:``).

Each answer is scored by containment (``contains``): the reference, lower-cased with its whitespace
collapsed, found in the answer treated the same; a list of references scores the share of them found.
That is SCBench's own scorer for ``scbench_vt`` (string_match_all) and, for a single reference,
``scbench_qa_eng`` and ``scbench_many_shot``; for ``scbench_kv`` and ``scbench_prefix_suffix`` SCBench
matches case-sensitively. The subsets scored otherwise (ROUGE, F1, code, options) are not offered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapeval.tasks.base import DataSource, Task

HUB_FILE = "hf://datasets/microsoft/SCBench/data/{subset}.jsonl"
FIRST_TURN = {
    "scbench_kv": (
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        "{context}\n\n{input}"
    ),
    "scbench_qa_eng": (
        "Read the book and answer the question. Be very concise in your answer.\n\n"
        "{context}\n\nQuestion: {input}\nAnswer:"
    ),
}
LATER_TURN = {"scbench_qa_eng": "Question: {input}\nAnswer:"}
PLAIN_FIRST, PLAIN_LATER = "{context}\n\n{input}", "{input}"


def source(subset: str) -> DataSource:
    """Where the rows of ``subset`` live."""
    return DataSource(
        name=f"SCBench {subset}",
        hub_id="microsoft/SCBench",
        hub_split="train",
        local_path=f"scbench/{subset}.jsonl",
        required=("id", "context", "multi_turns"),
        hub_data_files=(HUB_FILE.format(subset=subset),),
    )


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def references(answer: Any) -> list[str]:
    """The reference strings of a turn's ``answer`` (a string or a list of them); empty when it has none."""
    answers = answer if isinstance(answer, list) else [answer]
    if not all(isinstance(item, str) and item.strip() for item in answers):
        return []
    return answers


def contains(output: str, answer: Any) -> float:
    """The share of the references of ``answer`` that ``output`` contains, case and spacing aside."""
    expected = references(answer)
    if not expected:
        raise ValueError(f"no reference string in {answer!r}")
    found = _normal(output)
    return sum(_normal(reference) in found for reference in expected) / len(expected)


class Scbench(Task):
    """SCBench's multi-turn subsets: ``contains`` per turn (``turn_1``, ... and their mean, ``score``)."""

    names = ("scbench",)
    metrics = ("contains",)
    id_field = "id"
    multi_turn = True

    def rows(self, tokenizer=None) -> list[dict[str, Any]]:
        return self.data_rows(source(self.metadata["subset"]))

    def row_problem(self, row: Mapping[str, Any]) -> str | None:
        if not isinstance(row["context"], str):
            return "context is not a text"
        turns = row["multi_turns"]
        if not isinstance(turns, list) or not turns:
            return "multi_turns is not a list of turns"
        for number, turn in enumerate(turns, start=1):
            if not isinstance(turn, Mapping) or not isinstance(turn.get("input"), str):
                return f"multi_turns turn {number} has no input text"
            if not references(turn.get("answer")):
                return f"multi_turns turn {number} has no answer (a text, or a list of texts)"
        return None

    def user_text(self, row: Mapping[str, Any]) -> str:
        template = FIRST_TURN.get(self.metadata["subset"], PLAIN_FIRST)
        return template.format(context=row["context"], input=row["multi_turns"][0]["input"])

    def followups(self, row: Mapping[str, Any]) -> tuple[str, ...]:
        template = LATER_TURN.get(self.metadata["subset"], PLAIN_LATER)
        return tuple(template.format(input=turn["input"]) for turn in row["multi_turns"][1:])

    def target(self, row: Mapping[str, Any]) -> list[Any]:
        """Every turn's reference, in order."""
        return [turn["answer"] for turn in row["multi_turns"]]

    def prompt_metadata(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {"subset": self.metadata["subset"]}

    def score_row(self, row: Mapping[str, Any], output: str) -> dict[str, float]:
        return self.score_turn(row, 0, output)

    def score_turn(self, row: Mapping[str, Any], turn: int, output: str) -> dict[str, float]:
        return {"contains": contains(output, row["multi_turns"][turn]["answer"])}
