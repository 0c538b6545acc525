"""LiveCodeBench code generation: lcb_runner's prompts and grading, with every test run sandboxed.

Rows follow ``livecodebench/code_generation_lite``. Grading follows lcb_runner's
``testing_util``: the same implicit imports, stdin outputs compared line by line (whitespace
stripped, then as decimals), call-based results compared with ``==`` after tuples become lists,
and a program fails at its first failing test. Unlike lcb_runner, each test runs in its own
sandboxed process (:mod:`snapeval.sandbox`) and call-based results are compared in the harness,
as JSON, so that a program cannot fake a pass with an object whose ``__eq__`` always holds.
"""

from __future__ import annotations

import base64
import io
import json
import math
import pickle
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from snapeval.benchmarks import after_reasoning
from snapeval.sandbox import DEFAULT_LIMITS, ExecutionResult, SandboxLimits, run_program

SYSTEM_MESSAGE = (
    "You are an expert Python programmer. You will be given a question (problem specification) "
    "and will generate a correct Python program that matches the specification and passes all tests."
)
FORMAT_WITH_STARTER_CODE = (
    "You will use the following starter code to write the solution to the problem "
    "and enclose your code within delimiters."
)
FORMAT_WITHOUT_STARTER_CODE = (
    "Read the inputs from stdin solve the problem and write the answer to stdout "
    "(do not directly test on the sample inputs). Enclose your code within delimiters as follows. "
    "Ensure that when the python program runs, it reads the inputs, runs the algorithm "
    "and writes output to STDOUT."
)

# lcb_runner's ``import_string``, prepended to every solution.
IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
    "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
    "from builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\n"
    "import collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\n"
    "import statistics\nimport itertools\nimport functools\nimport operator\nimport io\nimport sys\n"
    "import json\nsys.setrecursionlimit(50000)\n"
)

_PYTHON_FENCE_TAGS = frozenset({"", "python", "python3", "py"})
_RESULT_MARKER = "\x1esnapeval-result\x1e"
_NO_RESULT = object()
_CALL_DRIVER = """
import json as _json
import sys as _sys

_namespace = {{"__name__": "solution"}}
exec(compile({source!r}, "solution.py", "exec"), _namespace)
_owner = _namespace["Solution"]() if {is_class} else None
_method = getattr(_owner, {func_name!r}) if {is_class} else _namespace[{func_name!r}]
_result = _method(*_json.loads(_sys.stdin.read()))
if isinstance(_result, tuple):
    _result = list(_result)
_sys.stdout.write("\\n" + {marker!r} + _json.dumps(_result) + "\\n")
"""

Verdict = Literal["passed", "wrong_answer", "runtime_error", "timeout", "memory", "no_code"]


@dataclass(frozen=True)
class CodeTest:
    """One test: stdin text and expected stdout, or newline-separated JSON arguments and JSON result."""

    input: str
    output: str


@dataclass(frozen=True)
class TestReport:
    """The outcome of one program on one problem: its verdict at the first failing test."""

    verdict: Verdict
    num_passed: int
    num_tests: int
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"


def build_prompt(row: Mapping[str, Any]) -> str:
    """The user message of lcb_runner's generic (chat) code-generation prompt."""
    prompt = f"### Question:\n{row['question_content']}\n\n"
    if row["starter_code"]:
        prompt += f"### Format: {FORMAT_WITH_STARTER_CODE}\n```python\n{row['starter_code']}\n```\n\n"
    else:
        prompt += f"### Format: {FORMAT_WITHOUT_STARTER_CODE}\n```python\n# YOUR CODE HERE\n```\n\n"
    return prompt + "### Answer: (use the provided format with backticks)\n\n"


def build_messages(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """The chat messages: lcb_runner's system message and :func:`build_prompt`."""
    return [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": build_prompt(row)}]


def extract_code(text: str) -> str | None:
    """The last complete fenced block tagged python (or untagged) after any reasoning trace."""
    blocks: list[tuple[str, str]] = []
    tag: str | None = None
    body: list[str] = []
    for line in after_reasoning(text).splitlines():
        stripped = line.strip()
        if tag is None:
            if stripped.startswith("```"):
                tag, body = (stripped[3:].split() or [""])[0].lower(), []
        elif stripped == "```":
            blocks.append((tag, "\n".join(body)))
            tag = None
        else:
            body.append(line)
    python = [code for tag, code in blocks if tag in _PYTHON_FENCE_TAGS]
    return python[-1] if python else None


def parse_tests(row: Mapping[str, Any]) -> list[CodeTest]:
    """Public then private tests; private ones may be compressed as on the Hub."""
    tests = _decode_tests(row["public_test_cases"]) + _decode_tests(row["private_test_cases"])
    return [CodeTest(test["input"], test["output"]) for test in tests]


def run_tests(code: str | None, row: Mapping[str, Any], limits: SandboxLimits = DEFAULT_LIMITS) -> TestReport:
    """Run ``code`` on every test of ``row`` in the sandbox, stopping at the first failure.

    ``limits.timeout_s`` bounds each test and ``limits.total_timeout_s`` all of them.
    """
    tests = parse_tests(row)
    if not tests:
        raise ValueError(f"problem {row.get('question_id')} has no tests")
    if not code:
        return TestReport("no_code", 0, len(tests))
    func_name = json.loads(row["metadata"] or "{}").get("func_name")
    program = _call_program(code, func_name) if func_name else IMPORTS + code
    budget = limits.total_timeout_s
    if budget is None:
        budget = (limits.timeout_s + 1) * len(tests) + 5
    deadline = time.monotonic() + budget
    for index, test in enumerate(tests):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return TestReport("timeout", index, len(tests), f"time budget of {budget:.0f} s exhausted")
        stdin = json.dumps([json.loads(arg) for arg in test.input.split("\n")]) if func_name else test.input
        result = run_program(program, stdin, replace(limits, timeout_s=min(limits.timeout_s, remaining)))
        verdict, detail = _judge(result, test, call_based=bool(func_name))
        if verdict != "passed":
            return TestReport(verdict, index, len(tests), detail)
    return TestReport("passed", len(tests), len(tests))


def outputs_match(actual: str, expected: str) -> bool:
    """lcb_runner's stdout check: same stripped lines, each equal as text or as decimals."""
    actual_lines, expected_lines = _stripped_lines(actual), _stripped_lines(expected)
    if len(actual_lines) != len(expected_lines):
        return False
    return all(
        got == want or ((decimals := _decimals(got)) is not None and decimals == _decimals(want))
        for got, want in zip(actual_lines, expected_lines, strict=True)
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator ``1 - C(n - c, k) / C(n, k)`` for ``c`` correct of ``n`` samples."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def filter_by_date(
    rows: Iterable[Mapping[str, Any]], start: str | date | None = None, end: str | date | None = None
) -> list[Mapping[str, Any]]:
    """Rows with ``start <= contest_date <= end``; a bare date means its midnight, as in lcb_runner."""
    low, high = _as_datetime(start), _as_datetime(end)
    return [
        row
        for row in rows
        if (low is None or low <= _as_datetime(row["contest_date"]))
        and (high is None or _as_datetime(row["contest_date"]) <= high)
    ]


def _as_datetime(value: str | date | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    return datetime.fromisoformat(value)


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


def _call_program(code: str, func_name: str) -> str:
    return _CALL_DRIVER.format(
        source=IMPORTS + "\n" + code,
        is_class="class Solution" in code,
        func_name=func_name,
        marker=_RESULT_MARKER,
    )


def _judge(result: ExecutionResult, test: CodeTest, *, call_based: bool) -> tuple[Verdict, str]:
    if result.status == "timeout":
        return "timeout", f"no answer within {result.seconds:.1f} s"
    if result.status == "memory":
        return "memory", "memory limit exceeded"
    if result.status != "ok":
        return "runtime_error", _shorten(result.stderr, keep_end=True) or f"exit status {result.returncode}"
    if call_based:
        returned = _returned_value(result.stdout)
        if returned is _NO_RESULT:
            return "runtime_error", "the function returned no result"
        correct, got = returned == json.loads(test.output), json.dumps(returned)
    else:
        correct, got = outputs_match(result.stdout, test.output), result.stdout
    if correct:
        return "passed", ""
    return "wrong_answer", f"expected {_shorten(test.output)!r}, got {_shorten(got)!r}"


def _returned_value(stdout: str) -> Any:
    """The JSON value the call driver printed last, or ``_NO_RESULT``."""
    _, found, payload = stdout.rpartition(_RESULT_MARKER)
    if not found:
        return _NO_RESULT
    try:
        return json.loads(payload.partition("\n")[0])
    except (ValueError, RecursionError):  # whatever a hostile program printed after the marker
        return _NO_RESULT


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        values = [Decimal(token) for token in line.split()]
    except InvalidOperation:
        return None
    # A signalling NaN raises on comparison; lcb_runner would crash on it.
    return None if any(value.is_snan() for value in values) else values


def _shorten(text: str, limit: int = 300, *, keep_end: bool = False) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return "..." + text[-limit:] if keep_end else text[:limit] + "..."
