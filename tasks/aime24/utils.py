"""AIME 2024 for lm-eval: the reasoning prompt, math-verify scoring of the last boxed answer.

Metadata: ``answer_from`` (``after_reasoning``: the last box after ``</think>``, snapeval's default;
``response``: the last box anywhere, as Qwen2.5-Math's evaluation), ``data_path`` (a local copy).
"""

import datasets

from snapeval.benchmarks import ANSWER_FROM, aime
from snapeval.data import AIME24, load_rows
from snapeval.tasks import metadata_choice

ANSWER_FROM_FIELD = "snapeval_answer_from"  # carried on each row, for process_results


def load(**metadata) -> datasets.DatasetDict:
    answer_from = metadata_choice(metadata, "answer_from", ANSWER_FROM, "after_reasoning")
    rows = [{**row, ANSWER_FROM_FIELD: answer_from} for row in load_rows(AIME24, metadata.get("data_path"))]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    return aime.build_prompt(doc["problem"])


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    answer_from = doc.get(ANSWER_FROM_FIELD, "after_reasoning")
    return {"acc": float(aime.score(results[0], str(doc["answer"]), answer_from)["acc"])}
