"""LiveCodeBench code generation: lcb_runner's prompts (per model style,
:mod:`~snapeval.tasks.livecodebench_prompts`), code extraction and grading, sandboxed.

Rows follow ``livecodebench/code_generation_lite``. A program is graded by
:mod:`~snapeval.tasks.livecodebench_grader` in one sandboxed process (:mod:`snapeval.sandbox`)
that runs all its tests, each timed on its own (the call, not the interpreter start-up), under
lcb_runner's limits: 6 s per test and ``(6 + 1) * tests + 5`` s for the program. The harness judges
each outcome as lcb_runner's ``testing_util`` does: stdout compared line by line (whitespace stripped,
then as decimals), a functional result compared with ``==`` after tuples become lists (a numpy
array element-wise, its truth value that of the comparison); a program
fails at its first failing test. Unlike lcb_runner, results are compared outside the sandbox, as
JSON, so that neither the expected outputs nor an object's own ``__eq__`` take part in the program's run.
As in lcb_runner, a program shares its process with the grading loop, so it could tamper with its own
per-test timing; the sandbox's budget for the whole run holds regardless.

Longer than 350 lines: one benchmark (extraction, data, judging); its prompts are
:mod:`snapeval.tasks.livecodebench_prompts`, its in-sandbox grader :mod:`snapeval.tasks.livecodebench_grader`.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import pickle
import sys
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

from snapeval.errors import SnapevalError
from snapeval.sandbox import DEFAULT_LIMITS, ExecutionResult, SandboxLimits, run_program
from snapeval.stops import cut_at_stop
from snapeval.tasks.base import DataSource, Task, after_reasoning, load_rows, local_file
from snapeval.tasks.livecodebench_grader import INT_MAX_STR_DIGITS, NDARRAY
from snapeval.tasks.livecodebench_prompts import STYLES, SYSTEM_MESSAGE, build_messages, generic_question

LIVECODEBENCH = DataSource(
    name="LiveCodeBench",
    hub_id="livecodebench/code_generation_lite",
    hub_split="test",
    local_path="livecodebench/code_generation_lite_v5_public.jsonl",
    required=("question_content", "platform", "question_id", "contest_date", "public_test_cases"),
)

_PYTHON_FENCE_TAGS = frozenset({"", "python", "python3", "py"})
HUB_FILES = "hf://datasets/livecodebench/code_generation_lite/{name}.jsonl"
RELEASES = 6  # release_v1 .. release_v6, each the union of the files up to it
_GRADER = (Path(__file__).parent / "livecodebench_grader.py").read_text(encoding="utf-8")
EXTRACTIONS = ("official", "lenient")

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
    seconds: float = 0.0  # the slowest test's time, the call alone

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"


def extract_code(text: str, mode: str = "official") -> str | None:
    """The program in a model's output, by ``mode``:

    * ``official`` (lcb_runner's ``extract_code``): the lines between the last two lines that contain
      a fence (```), whatever their tag, anywhere in the output, reasoning included; None with fewer
      than two fence lines;
    * ``lenient``: the last complete block tagged python (or untagged) after any reasoning trace,
      fences being lines that start with ```; None if there is none.
    """
    if mode == "official":
        lines = text.split("\n")
        fences = [index for index, line in enumerate(lines) if "```" in line]
        return "\n".join(lines[fences[-2] + 1 : fences[-1]]) if len(fences) >= 2 else None
    if mode != "lenient":
        raise ValueError(f"unknown code extraction {mode!r}; choose one of {', '.join(EXTRACTIONS)}")
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
    """Public then private tests (a row may lack private ones); private ones may be compressed as on
    the Hub."""
    tests = _decode_tests(row["public_test_cases"]) + _decode_tests(row.get("private_test_cases") or "[]")
    return [CodeTest(test["input"], test["output"]) for test in tests]


def run_tests(code: str | None, row: Mapping[str, Any], limits: SandboxLimits = DEFAULT_LIMITS) -> TestReport:
    """Grade ``code`` on every test of ``row``: one sandboxed process, each test under
    ``limits.timeout_s``, the whole run under ``limits.total_timeout_s`` (by default lcb_runner's
    ``(timeout + 1) * tests + 5`` seconds); the verdict is that of the first failing test."""
    tests = parse_tests(row)
    if not tests:
        raise ValueError(f"problem {row.get('question_id')} has no tests")
    if not code:
        return TestReport("no_code", 0, len(tests))
    func_name = json.loads(row.get("metadata") or "{}").get("func_name")
    budget = limits.total_timeout_s
    if budget is None:
        budget = (limits.timeout_s + 1) * len(tests) + 5
    job = {
        "code": code,
        "func_name": func_name,
        "inputs": [t.input for t in tests],
        "timeout_s": limits.timeout_s,
    }
    result = run_program(_GRADER, json.dumps(job), replace(limits, timeout_s=budget))
    with _big_integers():
        outcomes = _outcomes(result.stdout)
        slowest = 0.0
        for index, test in enumerate(tests):
            if index not in outcomes:
                verdict, detail = _ended_early(result, budget)
                return TestReport(verdict, index, len(tests), detail, slowest)
            slowest = max(slowest, outcomes[index].get("seconds", 0.0))
            verdict, detail = _judge(
                outcomes[index], test, call_based=bool(func_name), limit_s=limits.timeout_s
            )
            if verdict != "passed":
                return TestReport(verdict, index, len(tests), detail, slowest)
    return TestReport("passed", len(tests), len(tests), seconds=slowest)


def outputs_match(actual: str, expected: str) -> bool:
    """lcb_runner's stdout check: same stripped lines, each equal as text or as decimals."""
    actual_lines, expected_lines = _stripped_lines(actual), _stripped_lines(expected)
    if len(actual_lines) != len(expected_lines):
        return False
    return all(
        got == want or ((decimals := _decimals(got)) is not None and decimals == _decimals(want))
        for got, want in zip(actual_lines, expected_lines, strict=True)
    )


def release_files(release: str) -> tuple[str, ...]:
    """The Hub files of a release, as lcb_runner's ``version_tag``: ``release_vN`` is every problem up
    to version N (``test.jsonl``, ``test2.jsonl`` ... ``testN.jsonl``; release_v5 holds 880 problems),
    ``vN`` only those new in version N."""
    kind, _, number = release.rpartition("v")
    if kind not in ("release_", "") or not number.isdigit() or not 1 <= int(number) <= RELEASES:
        raise ValueError(
            f"unknown release {release!r}; choose release_v1 .. release_v{RELEASES} or v1 .. v{RELEASES}"
        )
    versions = range(1, int(number) + 1) if kind else [int(number)]
    return tuple(HUB_FILES.format(name="test" if v == 1 else f"test{v}") for v in versions)


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


@contextlib.contextmanager
def _big_integers() -> Iterator[None]:
    """Parse and print integers of up to lcb_runner's 50,000 digits meanwhile (Python's default is 4,300)."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(max(before, INT_MAX_STR_DIGITS) if before else 0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(before)


def _outcomes(stdout: str) -> dict[int, dict[str, Any]]:
    """The grader's report per test index (the first for each index; lines that do not parse are
    whatever a program wrote on the channel, and ignored)."""
    outcomes: dict[int, dict[str, Any]] = {}
    for line in stdout.split("\n"):
        with contextlib.suppress(ValueError, RecursionError):
            outcome = json.loads(line)
            if isinstance(outcome, dict) and isinstance(outcome.get("test"), int):
                seconds = outcome.get("seconds")
                if not isinstance(seconds, int | float) or isinstance(seconds, bool):
                    outcome["seconds"] = 0.0
                outcomes.setdefault(outcome["test"], outcome)
    return outcomes


def _ended_early(result: ExecutionResult, budget: float) -> tuple[Verdict, str]:
    """The verdict of the first test the grader did not report: the program's process ended first."""
    if result.status == "timeout":
        return "timeout", f"time budget of {budget:.0f} s exhausted"
    if result.status == "memory":
        return "memory", "memory limit exceeded"
    detail = _shorten(result.stderr, keep_end=True)
    return "runtime_error", detail or f"the program ended during the test (exit status {result.returncode})"


def _judge(
    outcome: Mapping[str, Any], test: CodeTest, *, call_based: bool, limit_s: float
) -> tuple[Verdict, str]:
    status = outcome.get("status")
    if status == "timeout":
        return "timeout", f"no answer within {limit_s:g} s"
    if status != "ok":
        error = str(outcome.get("error", ""))
        return ("memory" if error.startswith("MemoryError") else "runtime_error"), _shorten(
            error, keep_end=True
        )
    if call_based:
        got = outcome.get("value")
        correct = _call_result_equals(got, json.loads(test.output))
        got = json.dumps(got)
        if correct is None:
            return "runtime_error", f"comparing {_shorten(got)} with the answer raised, as in lcb_runner"
    else:
        got = str(outcome.get("stdout", ""))
        correct = outputs_match(got, test.output)
    if correct:
        return "passed", ""
    return "wrong_answer", f"expected {_shorten(test.output)!r}, got {_shorten(got)!r}"


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


def _shorten(text: str, limit: int = 300, *, keep_end: bool = False) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return "..." + text[-limit:] if keep_end else text[:limit] + "..."


class LiveCodeBench(Task):
    """LiveCodeBench code generation; ``pass@1`` overall and per platform (AtCoder, LeetCode).

    Config: ``prompt_style`` (lcb_runner's prompt for the model's style, see
    :mod:`~snapeval.tasks.livecodebench_prompts`; by default the model's ``prompt_style``), ``stop``
    (strings that end generation, as lcb_runner's vLLM ``stop``; the text from the first one on is
    not scored). Metadata: ``release`` (``release_v5``; the Hub files read), ``start_date``/``end_date`` (a
    contest-date window), ``code_extraction`` (``official`` or ``lenient``, see :func:`extract_code`),
    ``data_path`` (a local copy, taken whole).
    """

    names = ("livecodebench",)
    metrics = ("pass@1", "pass@1_atcoder", "pass@1_leetcode")
    options = {"code_extraction": EXTRACTIONS}
    system_message = SYSTEM_MESSAGE
    id_field = "question_id"

    def __init__(self, cfg: Mapping[str, Any], seed: int = 0, limit: int | None = None) -> None:
        super().__init__(cfg, seed, limit)
        self.prompt_style: str = cfg.get("prompt_style") or next(iter(STYLES))
        if self.prompt_style not in STYLES:
            message = f"unknown prompt style {self.prompt_style!r}; choose one of {', '.join(STYLES)}"
            raise SnapevalError(message, "task.prompt_style")
        stop = cfg.get("stop") or []
        if not isinstance(stop, list | tuple) or not all(isinstance(text, str) and text for text in stop):
            raise SnapevalError(f"must be a list of non-empty strings, got {stop!r}", "task.stop")
        self.stop: tuple[str, ...] = tuple(stop)
        try:
            self.limits = SandboxLimits(**dict(cfg.get("sandbox") or {}))
        except TypeError as exc:
            raise SnapevalError(f"not a SandboxLimits field ({exc})", "task.sandbox") from None

    def rows(self, tokenizer=None) -> list[dict]:
        release = self.metadata.get("release") or "release_v5"
        try:
            source = replace(LIVECODEBENCH, hub_data_files=release_files(release))
        except ValueError as exc:
            raise SnapevalError(str(exc), "task.metadata.release") from None
        data_path = self.metadata.get("data_path")
        rows = filter_by_date(
            load_rows(source, data_path), self.metadata.get("start_date"), self.metadata.get("end_date")
        )
        path = local_file(source, data_path)
        where = f"{path}, a local copy taken whole" if path else f"{source.hub_id} {release}"
        print(f"LiveCodeBench: {len(rows)} problems loaded from {where}", file=sys.stderr)
        return rows

    def user_text(self, row) -> str:
        return generic_question(row)

    def messages(self, row) -> list[dict[str, str]]:
        return build_messages(row, self.prompt_style)

    def target(self, row) -> str:
        return ""

    def score_row(self, row, output: str) -> dict[str, float]:
        code = extract_code(cut_at_stop(output, self.stop), self.metadata["code_extraction"])
        passed = float(run_tests(code, row, self.limits).passed)
        return {"pass@1": passed, f"pass@1_{row['platform']}": passed}
