"""Grading one program on one problem: all its tests in one sandboxed process, judged outside it.

:func:`run_tests` runs :mod:`~snapeval.tasks.livecodebench.grader` as the sandboxed program
(:mod:`snapeval.sandbox`); it runs every test, each timed on its own (the call, not the interpreter
start-up), under lcb_runner's limits: 6 s per test and ``(6 + 1) * tests + 5`` s for the program.
Each reported outcome is judged by :mod:`~snapeval.tasks.livecodebench.judging`; a program fails at
its first failing test. As in lcb_runner, a program shares its process with the grading loop, so it
could tamper with its own per-test timing; the sandbox's budget for the whole run holds regardless.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from snapeval.errors import SnapevalError
from snapeval.sandbox import DEFAULT_LIMITS, ExecutionResult, SandboxLimits, run_program
from snapeval.tasks.hub import DATA_PATH_FIELD
from snapeval.tasks.livecodebench.cases import parse_tests
from snapeval.tasks.livecodebench.grader import INT_MAX_STR_DIGITS
from snapeval.tasks.livecodebench.judging import Verdict, ended_early, judge

_GRADER = (Path(__file__).parent / "grader.py").read_text(encoding="utf-8")

#: Runs a program (code, stdin, limits) as :func:`snapeval.sandbox.run_program` does, which reads the
#: wall clock: it stops the run when ``limits.timeout_s`` has passed.
Runner = Callable[[str, str, SandboxLimits], ExecutionResult]


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


def run_tests(
    code: str | None,
    row: Mapping[str, Any],
    limits: SandboxLimits = DEFAULT_LIMITS,
    run: Runner = run_program,
) -> TestReport:
    """Grade ``code`` on every test of ``row``: one sandboxed process (started by ``run``), each test under
    ``limits.timeout_s``, the whole run under ``limits.total_timeout_s`` (by default lcb_runner's
    ``(timeout + 1) * tests + 5`` seconds); the verdict is that of the first failing test."""
    tests = parse_tests(row)
    if not tests:  # rows read by the task were refused at load (cases.tests_problem); a row built elsewhere
        raise SnapevalError(f"problem {row.get('question_id')!r} has no tests", DATA_PATH_FIELD)
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
    result = run(_GRADER, json.dumps(job), replace(limits, timeout_s=budget))
    with _big_integers():
        outcomes = _outcomes(result.stdout)
        slowest = 0.0
        for index, test in enumerate(tests):
            if index not in outcomes:
                verdict, detail = ended_early(result, budget)
                return TestReport(verdict, index, len(tests), detail, slowest)
            slowest = max(slowest, outcomes[index].get("seconds", 0.0))
            verdict, detail = judge(
                outcomes[index], test, call_based=bool(func_name), limit_s=limits.timeout_s
            )
            if verdict != "passed":
                return TestReport(verdict, index, len(tests), detail, slowest)
    return TestReport("passed", len(tests), len(tests), seconds=slowest)


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
