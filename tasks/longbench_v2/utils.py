"""LongBench-v2 for lm-eval: official 0-shot and CoT prompts, answer regex, difficulty/length splits."""

import datasets

from snapeval.benchmarks import longbench_v2
from snapeval.data import LONGBENCH_V2, load_rows


def load(**metadata) -> datasets.DatasetDict:
    rows = load_rows(LONGBENCH_V2, metadata.get("data_path"))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    return longbench_v2.build_prompt(doc)


def doc_to_text_cot(doc: dict) -> str:
    return longbench_v2.build_prompt(doc, cot=True)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    scored = longbench_v2.score(results[0], doc)
    acc = float(scored["acc"])
    return {"acc": acc, f"acc_{scored['difficulty']}": acc, f"acc_{scored['length']}": acc}
