"""Judging one test's outcome as lcb_runner's ``testing_util`` does, outside the sandbox.

stdout is compared line by line (whitespace stripped, then as decimals); a functional result with
``==`` after tuples become lists (a numpy array element-wise, its truth value that of the comparison).
The grader's outcomes arrive as JSON, so neither the expected outputs nor an object's own ``__eq__``
take part in the program's run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from snapeval.sandbox import ExecutionResult
from snapeval.tasks.livecodebench.cases import CodeTest
from snapeval.tasks.livecodebench.grader import NDARRAY

Verdict = Literal["passed", "wrong_answer", "runtime_error", "timeout", "memory", "no_code"]


def judge(
    outcome: Mapping[str, Any], test: CodeTest, *, call_based: bool, limit_s: float
) -> tuple[Verdict, str]:
    """The verdict of one test the grader reported on, and why it failed."""
    status = outcome.get("status")
    if status == "timeout":
        return "timeout", f"no answer within {limit_s:g} s"
    if status != "ok":
        error = str(outcome.get("error", ""))
        return ("memory" if error.startswith("MemoryError") else "runtime_error"), shorten(
            error, keep_end=True
        )
    if call_based:
        got = outcome.get("value")
        correct = _call_result_equals(got, json.loads(test.output))
        got = json.dumps(got)
        if correct is None:
            return "runtime_error", f"comparing {shorten(got)} with the answer raised, as in lcb_runner"
    else:
        got = str(outcome.get("stdout", ""))
        correct = outputs_match(got, test.output)
    if correct:
        return "passed", ""
    return "wrong_answer", f"expected {shorten(test.output)!r}, got {shorten(got)!r}"


def ended_early(result: ExecutionResult, budget: float) -> tuple[Verdict, str]:
    """The verdict of the first test the grader did not report: the program's process ended first."""
    if result.status == "timeout":
        return "timeout", f"time budget of {budget:.0f} s exhausted"
    if result.status == "memory":
        return "memory", "memory limit exceeded"
    detail = shorten(result.stderr, keep_end=True)
    return "runtime_error", detail or f"the program ended during the test (exit status {result.returncode})"


def outputs_match(actual: str, expected: str) -> bool:
    """lcb_runner's stdout check: same stripped lines, each equal as text or as decimals."""
    actual_lines, expected_lines = _stripped_lines(actual), _stripped_lines(expected)
    if len(actual_lines) != len(expected_lines):
        return False
    return all(
        got == want or ((decimals := _decimals(got)) is not None and decimals == _decimals(want))
        for got, want in zip(actual_lines, expected_lines, strict=True)
    )


def shorten(text: str, limit: int = 300, *, keep_end: bool = False) -> str:
    """``text`` stripped and cut to ``limit`` characters (its end kept for an error's traceback)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return "..." + text[-limit:] if keep_end else text[:limit] + "..."


def _call_result_equals(got: Any, expected: Any) -> bool | None:
    """lcb_runner's ``prediction == expected`` as a truth value; None where that raises. A numpy array
    compares element-wise, as there: a 1-element array equals a number it holds; a longer one raises."""
    if isinstance(got, dict) and set(got) == {NDARRAY}:
        import numpy as np

        try:
            return bool(np.array(got[NDARRAY]) == expected)
        except (ValueError, TypeError):
            return None
    return got == expected


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        values = [Decimal(token) for token in line.split()]
    except InvalidOperation:
        return None
    # A signalling NaN raises on comparison; lcb_runner would crash on it.
    return None if any(value.is_snan() for value in values) else values
