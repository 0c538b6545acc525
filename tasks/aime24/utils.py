"""AIME 2024 for lm-eval: the reasoning prompt, math-verify scoring of the last boxed answer."""

import datasets

from snapeval.benchmarks import aime
from snapeval.data import AIME24, load_rows


def load(**metadata) -> datasets.DatasetDict:
    rows = load_rows(AIME24, metadata.get("data_path"))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    return aime.build_prompt(doc["problem"])


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"acc": float(aime.score(results[0], str(doc["answer"]))["acc"])}
