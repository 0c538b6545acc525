"""LiveCodeBench (code_generation_lite) for lm-eval: official prompts, sandboxed public/private tests."""

import datasets

from snapeval.benchmarks import livecodebench
from snapeval.data import LIVECODEBENCH, load_rows


def load(**metadata) -> datasets.DatasetDict:
    rows = load_rows(LIVECODEBENCH, metadata.get("data_path"))
    rows = livecodebench.filter_by_date(rows, metadata.get("start_date"), metadata.get("end_date"))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    return livecodebench.build_prompt(doc)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    report = livecodebench.run_tests(livecodebench.extract_code(results[0]), doc)
    passed = float(report.passed)
    return {"pass@1": passed, f"pass@1_{doc['platform']}": passed}
