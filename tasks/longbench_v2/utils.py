"""LongBench-v2 for lm-eval: official 0-shot and CoT prompts, answer regex, difficulty/length splits.

Metadata: ``answer_from`` (``response``: the whole output, as pred.py; ``after_reasoning``: only the
text after ``</think>``), ``data_path`` (a local copy).
"""

import datasets

from snapeval.benchmarks import ANSWER_FROM, longbench_v2
from snapeval.data import LONGBENCH_V2, load_rows
from snapeval.tasks import metadata_choice

ANSWER_FROM_FIELD = "snapeval_answer_from"  # carried on each row, for process_results


def load(**metadata) -> datasets.DatasetDict:
    answer_from = metadata_choice(metadata, "answer_from", ANSWER_FROM, "response")
    rows = [
        {**row, ANSWER_FROM_FIELD: answer_from} for row in load_rows(LONGBENCH_V2, metadata.get("data_path"))
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    return longbench_v2.build_prompt(doc)


def doc_to_text_cot(doc: dict) -> str:
    return longbench_v2.build_prompt(doc, cot=True)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    scored = longbench_v2.score(results[0], doc, doc.get(ANSWER_FROM_FIELD, "response"))
    acc = float(scored["acc"])
    return {"acc": acc, f"acc_{scored['difficulty']}": acc, f"acc_{scored['length']}": acc}
