"""LiveCodeBench (code_generation_lite) for lm-eval: official prompts, sandboxed public/private tests.

Metadata: ``release`` (``release_v5``: the Hub files read), ``start_date``/``end_date`` (a contest-date
window), ``code_extraction`` (``official`` or ``lenient``, see ``livecodebench.extract_code``),
``data_path`` (a local copy, taken whole).
"""

import dataclasses
import sys

import datasets

from snapeval.benchmarks import livecodebench
from snapeval.data import LIVECODEBENCH, load_rows, local_file
from snapeval.errors import SnapevalError
from snapeval.tasks import metadata_choice

EXTRACTION = "snapeval_code_extraction"  # carried on each row, for process_results


def load(**metadata) -> datasets.DatasetDict:
    extraction = metadata_choice(metadata, "code_extraction", livecodebench.EXTRACTIONS, "official")
    release = metadata.get("release") or "release_v5"
    try:
        source = dataclasses.replace(LIVECODEBENCH, hub_data_files=livecodebench.release_files(release))
    except ValueError as exc:
        raise SnapevalError(str(exc), "task.metadata.release") from None
    rows = load_rows(source, metadata.get("data_path"))
    rows = livecodebench.filter_by_date(rows, metadata.get("start_date"), metadata.get("end_date"))
    path = local_file(source, metadata.get("data_path"))
    where = f"{path}, a local copy taken whole" if path else f"{source.hub_id} {release}"
    print(f"LiveCodeBench: {len(rows)} problems loaded from {where}", file=sys.stderr)
    rows = [{**row, EXTRACTION: extraction} for row in rows]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    return livecodebench.build_prompt(doc)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    code = livecodebench.extract_code(results[0], doc.get(EXTRACTION, "official"))
    passed = float(livecodebench.run_tests(code, doc).passed)
    return {"pass@1": passed, f"pass@1_{doc['platform']}": passed}
