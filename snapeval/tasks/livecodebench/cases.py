"""A problem's test cases, as the Hub stores them (private ones compressed and pickled), and what makes a
row's tests unusable (:func:`tests_problem`), found when the data is read rather than when a program is
graded."""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TEST_FIELDS = ("public_test_cases", "private_test_cases")


@dataclass(frozen=True)
class CodeTest:
    """One test: stdin text and expected stdout, or newline-separated JSON arguments and JSON result."""

    input: str
    output: str


def parse_tests(row: Mapping[str, Any]) -> list[CodeTest]:
    """Public then private tests (a row may lack private ones); private ones may be compressed as on
    the Hub."""
    tests = _decode_tests(row["public_test_cases"]) + _decode_tests(row.get("private_test_cases") or "[]")
    return [CodeTest(test["input"], test["output"]) for test in tests]


def tests_problem(row: Mapping[str, Any]) -> str | None:
    """What makes ``row``'s tests unusable, naming the field (None: at least one test, each with input and
    output text; a functional problem's outputs JSON; ``metadata`` a JSON object)."""
    try:
        metadata = json.loads(row.get("metadata") or "{}")
    except (TypeError, ValueError, RecursionError):
        metadata = None
    if not isinstance(metadata, dict):
        return "metadata: must be a JSON object (with func_name for a functional problem)"
    count = 0
    for name in TEST_FIELDS:
        if name not in row or (name == "private_test_cases" and not row[name]):
            continue
        try:
            tests = _decode_tests(row[name])
        except Exception as exc:  # noqa: BLE001 - json, base64, zlib and pickle each raise their own
            kind = type(exc).__name__
            kind = f"{type(exc).__module__}.{kind}" if kind.lower() == "error" else kind  # binascii, zlib
            reason = " ".join(f"{kind}: {exc}".split())[:120]
            return f"{name}: neither a JSON list of tests nor the Hub's compressed one ({reason})"
        if not isinstance(tests, list) or not all(_is_test(test) for test in tests):
            return f"{name}: must be a list of tests, each with input and output strings"
        for number, test in enumerate(tests, start=1):
            if metadata.get("func_name") and not _is_json(test["output"]):
                return f"{name}: test {number}'s output is not JSON (a functional problem's result)"
        count += len(tests)
    return None if count else f"{' and '.join(TEST_FIELDS)}: no tests"


def _is_test(test: Any) -> bool:
    return (
        isinstance(test, dict) and isinstance(test.get("input"), str) and isinstance(test.get("output"), str)
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Unpickles plain data only: the Hub's private tests are a pickled JSON string."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _decode_tests(field: str) -> list[dict[str, str]]:
    try:
        return json.loads(field)
    except json.JSONDecodeError:
        payload = zlib.decompress(base64.b64decode(field))
        return json.loads(_NoGlobalsUnpickler(io.BytesIO(payload)).load())
