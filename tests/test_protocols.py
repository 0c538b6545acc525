"""Verdict equivalence with the official harnesses, and the switches where snapeval differs on purpose.

Expected verdicts are written from the official rules (LiveCodeBench ``lcb_runner`` testing_util and
extraction_utils, LongBench's ``pred.py``), not from snapeval's output: each row says why the official
grader decides so. Problems are built here, so the suite runs without the shared data. AIME's scorers
are held to their originals' recorded verdicts in ``tests/test_aime_scorers.py``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from snapeval.decode.stops import cut_at_stop, stop_check
from snapeval.sandbox import ExecutionResult, SandboxLimits, run_program
from snapeval.stats import pass_at
from snapeval.tasks import livecodebench as lcb
from snapeval.tasks import longbench_v2 as lb

from .conftest import composed_sweep

BIG = "9" * 5000


def stdin_problem(*cases: tuple[str, str]) -> dict[str, Any]:
    tests = [{"input": given, "output": expected, "testtype": "stdin"} for given, expected in cases]
    return {"question_id": "stdin", "public_test_cases": json.dumps(tests), "metadata": "{}"}


def functional_problem(func_name: str, *cases: tuple[str, str]) -> dict[str, Any]:
    tests = [{"input": given, "output": expected, "testtype": "functional"} for given, expected in cases]
    return {
        "question_id": "functional",
        "public_test_cases": json.dumps(tests),
        "private_test_cases": "[]",
        "metadata": json.dumps({"func_name": func_name}),
    }


ADD_ONE = stdin_problem(("3\n", "4\n"), ("10\n", "11\n"), ("41\n", "42\n"))
BIG_PLUS_ONE = stdin_problem((BIG + "\n", "1" + "0" * 5000 + "\n"))
APPEND = functional_problem("append", ("[1, 2]\n3", "[1, 2, 3]"), ("[]\n7", "[7]"))
SLOW = "import time\n"


def append_method(*body: str, head: str = "") -> str:
    """A functional solution of APPEND whose method body is ``body`` (lines), after ``head``."""
    return (
        head
        + "class Solution:\n    def append(self, a, x):\n"
        + "".join(f"        {line}\n" for line in body)
    )


# (program, problem, official verdict, why) -- the official grader passes a program iff it passes.
# Checked by running lcb_runner's evaluate_generations_by_problem (1 s per test) on each: the same
# pass/fail on all but the last (json_comparison, README "Protocols"), the same verdict on all but
# the functional sys.exit() (lcb_runner: TestRunnerError, a failure).
VERDICTS = [
    ("print(int(input()) + 1)", ADD_ONE, "passed", "correct"),
    ("print(int(input()) + 2)", ADD_ONE, "wrong_answer", "wrong output"),
    ("print(int(input()) + 1, end='  \\n\\n')", ADD_ONE, "passed", "lines compared stripped"),
    ("print(f'{int(input()) + 1}.000')", ADD_ONE, "passed", "a line equal as decimals"),
    ("import sys\nprint(int(input()) + 1)\nsys.exit(1)", ADD_ONE, "passed", "SystemExit is caught"),
    ("print(int(input()) + 1)\nexit()", ADD_ONE, "passed", "exit() is SystemExit"),
    ("print(int(input()) + 1)\nquit()", ADD_ONE, "runtime_error", "reliability_guard sets quit = None"),
    ("import os\nprint(os.getcwd())", ADD_ONE, "runtime_error", "reliability_guard sets os.getcwd = None"),
    ("raise ValueError('no')", ADD_ONE, "runtime_error", "an exception"),
    ("while True:\n    pass", ADD_ONE, "timeout", "6 s per test"),
    ("print(int(input()) + 1)", BIG_PLUS_ONE, "passed", "sys.set_int_max_str_digits(50000)"),
    (
        "def main():\n    print(int(input()) + 1)\n\nif __name__ == '__main__':\n    main()",
        ADD_ONE,
        "passed",
        "a final __main__ block is unwrapped",
    ),
    (
        "def main():\n    print(int(input()) + 1)\n\nif '__main__' == __name__:\n    main()",
        ADD_ONE,
        "wrong_answer",
        "only `__name__ == '__main__'` is unwrapped; the module is tmp_sol, so main never runs",
    ),
    (
        "n = int(input())\ndef f():\n    global n\n    return n + 1\nprint(f())",
        ADD_ONE,
        "runtime_error",
        "statements run inside wrapped_function(): n is a local there, not a global",
    ),
    ("import sys\nprint(int(sys.stdin.readline()) + 1)", ADD_ONE, "passed", "sys.stdin is mocked"),
    (
        "from sys import stdin\nprint(int(stdin.readline()) + 1)",
        ADD_ONE,
        "passed",
        "readline is patched on the real stdin too, which the hoisted import bound",
    ),
    ("import sys\nprint(int(sys.stdin.buffer.read()) + 1)", ADD_ONE, "passed", "the mock has a buffer"),
    ("import sys\nprint(int(sys.stdin.read()) + 1)", ADD_ONE, "passed", "read() is the whole input"),
    (
        "import sys\nfor line in sys.stdin:\n    print(int(line) + 1)",
        ADD_ONE,
        "runtime_error",
        "the stdin mock is not iterable",
    ),
    (
        "print(int(open(0).read()) + 1)",
        ADD_ONE,
        "runtime_error",
        "open is bound by `from builtins import *` before open is mocked: it reads the empty real stdin",
    ),
    (
        "from sys import stdout\nstdout.write(str(int(input()) + 1))",
        ADD_ONE,
        "wrong_answer",
        "the hoisted import bound the real stdout, which is not captured",
    ),
    (
        "import sys\nprint(int(input()) + 1)\nsys.stdout.close()",
        ADD_ONE,
        "runtime_error",
        "the capture's close() takes an argument",
    ),
    (
        "try:\n    while True:\n        pass\nexcept Exception:\n    pass\nprint(int(input()) + 1)",
        ADD_ONE,
        "wrong_answer",
        "the alarm's 'timeout occured' line lands in the captured stdout, swallowed or not",
    ),
    (append_method("return a + [x]"), APPEND, "passed", "correct"),
    (
        append_method(
            "try:", "    time.sleep(3)", "except Exception:", "    pass", "return a + [x]", head=SLOW
        ),
        APPEND,
        "passed",
        "a functional call's swallowed alarm prints outside any capture",
    ),
    (
        append_method("print('debug')", "return (*a, x)"),
        APPEND,
        "passed",
        "a returned tuple becomes a list; prints are ignored",
    ),
    (
        append_method("return [np.int64(v) for v in a + [x]]", head="import numpy as np\n"),
        APPEND,
        "passed",
        "numpy integers equal ints",
    ),
    (
        append_method("return [tuple(a + [x])]"),
        APPEND,
        "wrong_answer",
        "a nested tuple is no list",
    ),
    (append_method("return a"), APPEND, "wrong_answer", "wrong result"),
    (
        append_method(
            "self.calls = getattr(self, 'calls', 0) + 1",
            "return a + [x] if self.calls == 1 else a",
        ),
        APPEND,
        "wrong_answer",
        "one Solution() for all tests: its state carries over",
    ),
    (
        append_method("sys.exit(0)", head="import sys\n"),
        APPEND,
        "runtime_error",
        "SystemExit is not caught in a functional call",
    ),
    (append_method("return a + [x]").replace("append", "add"), APPEND, "runtime_error", "no such method"),
    # Deliberate difference: lcb_runner compares with the returned object's own __eq__.
    (
        append_method("return Yes()", head="class Yes:\n    def __eq__(self, other):\n        return True\n"),
        APPEND,
        "wrong_answer",
        "(official: passed) snapeval compares JSON values outside the sandbox, never the object's __eq__",
    ),
]


@pytest.mark.parametrize(("code", "problem", "verdict", "why"), VERDICTS, ids=[v[3] for v in VERDICTS])
def test_lcb_verdicts_are_the_official_graders(code: str, problem: dict, verdict: str, why: str) -> None:
    report = lcb.run_tests(code, problem, SandboxLimits(timeout_s=1))
    assert report.verdict == verdict, report


def test_lcb_times_each_call_not_the_interpreter_or_the_compilation() -> None:
    """0.7 s to compile and 0.7 s per call pass a 1 s limit: each is timed alone (lcb_runner's alarm
    around compile_code and around each call); a fresh interpreter per test would take 1.4 s and more."""
    slow = (
        "import time\ntime.sleep(0.7)\n"
        "class Solution:\n    def append(self, a, x):\n        time.sleep(0.7)\n        return a + [x]"
    )
    report = lcb.run_tests(slow, APPEND, SandboxLimits(timeout_s=1))
    assert report.passed, report
    too_slow = slow.replace("time.sleep(0.7)\n        return", "time.sleep(1.3)\n        return")
    assert lcb.run_tests(too_slow, APPEND, SandboxLimits(timeout_s=1)).verdict == "timeout"


def test_lcb_the_program_budget_is_lcb_runners() -> None:
    """The program runs under (timeout + 1) * tests + 5 s unless told otherwise; stopped at its budget,
    it fails at the first test it did not finish. The stop stands in for the sandbox's clock."""
    budgets: list[float] = []

    def sandbox(program: str, stdin: str, limits: SandboxLimits) -> ExecutionResult:
        budgets.append(limits.timeout_s)
        return run_program(program, stdin, limits)

    def stopped_in_the_second_test(program: str, stdin: str, limits: SandboxLimits) -> ExecutionResult:
        finished = sandbox(program, stdin, limits)
        return replace(finished, status="timeout", stdout=finished.stdout.split("\n")[0] + "\n")

    each = "print(int(input()) + 1)"
    assert lcb.run_tests(each, ADD_ONE, SandboxLimits(timeout_s=1), run=sandbox).passed
    limits = SandboxLimits(timeout_s=1, total_timeout_s=4)
    report = lcb.run_tests(each, ADD_ONE, limits, run=stopped_in_the_second_test)
    assert budgets == [(1 + 1) * 3 + 5, 4]
    assert (report.verdict, report.num_passed) == ("timeout", 1), report
    assert report.detail == "time budget of 4 s exhausted"


def test_lcb_grades_in_the_configured_interpreter_with_its_packages() -> None:
    probe = (
        "import sys, numpy\nclass Solution:\n    def append(self, a, x):\n"
        "        return [sys.executable, numpy.__name__]"
    )
    expected = json.dumps([sys.executable, "numpy"])
    report = lcb.run_tests(probe, functional_problem("append", ("[]\n0", expected)))
    assert report.passed, report


# --- code extraction: the five probes where the official rule and the lenient one differ -------------

EXTRACTIONS = [
    ("```python\nprint(1)\n```", "print(1)", "print(1)", "one block"),
    ("```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```", "print(2)", "print(2)", "last block"),
    ("print(1)", None, None, "no fence"),
    ("```cpp\nint main() {}\n```", "int main() {}", None, "a cpp block"),
    ("<think>\n```python\nprint(1)\n```\n</think>\nDone.", "print(1)", None, "code only inside <think>"),
    ("```python\nprint(1)\n``` that was the code", "print(1)", None, "a fence line with trailing text"),
    ("```python\nprint(1)\n```\nOutput:\n```text\n1\n```", "1", "print(1)", "a text block after the code"),
    ("```python\nprint(1)\n```\nOr:\n```python\nprint(2)", "Or:", "print(1)", "an unclosed last block"),
]


@pytest.mark.parametrize(
    ("output", "official", "lenient", "why"), EXTRACTIONS, ids=[x[3] for x in EXTRACTIONS]
)
def test_lcb_code_extraction_modes(output: str, official: str | None, lenient: str | None, why: str) -> None:
    assert lcb.extract_code(output) == official  # the default
    assert lcb.extract_code(output, "official") == official
    assert lcb.extract_code(output, "lenient") == lenient
    with pytest.raises(ValueError, match="lenient"):
        lcb.extract_code(output, "strict")


# --- LongBench-v2 and AIME answer extraction --------------------------------------------------------

LONGBENCH = [
    ("The correct answer is (B)", "B", "B"),
    ("**The correct answer is (C)**", "C", "C"),
    ("The correct answer is D, because", "D", "D"),
    ("The correct answer is B. The correct answer is (C)", "C", "C"),  # the (X) pattern is tried first
    ("<think>The correct answer is (A)? No.</think>The correct answer is (B)", "A", "B"),
    ("<think>The correct answer is (C)</think>I am not sure.", "C", None),
    ("I cannot tell.", None, None),
]


@pytest.mark.parametrize(("response", "official", "after_reasoning"), LONGBENCH)
def test_longbench_answer_extraction(response: str, official: str | None, after_reasoning: str | None):
    assert lb.extract_answer(response) == official  # pred.py reads the whole response
    assert lb.extract_answer(response, "response") == official
    assert lb.extract_answer(response, "after_reasoning") == after_reasoning


# --- LiveCodeBench data and metrics -----------------------------------------------------------------


def test_lcb_releases_are_unions_of_the_hub_files() -> None:
    files = lcb.release_files("release_v5")
    assert [f.rsplit("/", 1)[1] for f in files] == ["test.jsonl", *[f"test{v}.jsonl" for v in range(2, 6)]]
    assert lcb.release_files("v5") == (files[-1],)
    assert len(lcb.release_files("release_v6")) == 6
    for bad in ("release_v7", "v0", "latest", "release_vx"):
        with pytest.raises(ValueError, match="release_v1"):
            lcb.release_files(bad)


def test_lcb_a_row_without_private_tests_loads() -> None:
    row = {"public_test_cases": json.dumps([{"input": "1\n", "output": "2\n", "testtype": "stdin"}])}
    assert lcb.parse_tests(row) == [lcb.CodeTest("1\n", "2\n")]


def test_pass_at_k_over_problems_and_draws() -> None:
    ids = [f"p{p}#{d}" for p in range(2) for d in range(10)]
    scores = [1.0] * 3 + [0.0] * 7 + [0.0] * 10
    result = pass_at(ids, scores)
    assert result["pass@5"] == pytest.approx((1 - 21 / 252) / 2)  # p0: 1 - C(7,5)/C(10,5); p1: 0
    assert result["pass@10"] == pytest.approx(0.5)
    assert pass_at(ids[:5] + ids[10:15], scores[:5] + scores[10:15]) == {"pass@5": pytest.approx(0.5)}
    assert pass_at(["a", "b"], [1.0, 0.0]) == {}  # single answers
    assert pass_at(ids, [0.5] * 20) == {}  # not pass/fail scores


# --- configs: budgets, presets and the paper models -------------------------------------------------


def test_longbench_composes_with_the_official_120k_budget() -> None:
    (cfg,) = composed_sweep(None, "task=longbench_v2", "model=llama-3.1-8b-instruct")
    assert cfg["task"]["max_prompt_tokens"] == 120_000
    assert cfg["model"]["max_context"] - cfg["task"]["max_new_tokens"] >= 120_000
    assert cfg["task"]["metadata"]["answer_from"] == "response"
    assert cfg["generation"]["do_sample"] is False  # snapeval's greedy default
    (qwen,) = composed_sweep(None, "task=longbench_v2", "model=qwen2.5-7b-instruct")
    assert qwen["model"]["max_context"] == 131_072  # with the model card's YaRN, as LongBench-v2 ran it
    assert qwen["model"]["config_overrides"]["rope_parameters"]["rope_type"] == "yarn"


def test_lcb_a_program_writing_forged_reports_gains_nothing() -> None:
    """A program that finds the grader's channel and writes reports of its own: malformed ones are
    ignored (no crash), and a forged report is judged like any other: it needs the right output."""
    reports = [
        {"test": 0, "status": "ok", "seconds": "x", "stdout": "99"},
        {"test": 1, "status": "ok", "stdout": 11},
    ]
    lines = "".join(json.dumps(report) + "\n" for report in reports) + "[not json\n"
    forge = f"import os\nfor fd in range(3, 20):\n    try:\n        os.write(fd, {lines.encode()!r})\n"
    forge += "    except OSError:\n        pass\n"
    report = lcb.run_tests(forge, ADD_ONE, SandboxLimits(timeout_s=1))
    assert (report.verdict, report.num_passed) == ("wrong_answer", 0), report
    assert "got '99'" in report.detail  # the forged report reached the harness, and failed


@pytest.mark.parametrize(
    "returned",
    [
        "numpy.array(a + [x])",  # equal items, but the truth value of [True, True, True] raises
        "numpy.array([len(a) + 1])",  # broadcast against the 3-item answer: raises too
        "numpy.array([a + [x]])",
        "numpy.array(a + [x, x])",  # shapes that do not compare
        "numpy.array([7])",
    ],
)
def test_lcb_numpy_arrays_compare_as_numpy_compares_them(returned: str) -> None:
    """lcb_runner judges ``prediction == expected``: with a numpy array that is element-wise, and the
    truth value of more than one element raises, a runtime error (each verdict recorded by running
    lcb_runner's testing_util on the program)."""
    code = f"import numpy\nclass Solution:\n    def append(self, a, x):\n        return {returned}"
    problem = functional_problem("append", ("[1, 2]\n3", "[1, 2, 3]"))
    assert lcb.run_tests(code, problem, SandboxLimits(timeout_s=2)).verdict == "runtime_error"


def test_lcb_a_one_element_array_for_a_number_passes_as_in_lcb_runner() -> None:
    """Recorded with lcb_runner: ``array([4])`` for 4 passes, ``array([3])`` fails, ``array([4, 3])``
    raises."""
    problem = functional_problem("inc", ("3", "4"))
    one = "import numpy\nclass Solution:\n    def inc(self, x):\n        return numpy.array([x + 1])"
    assert lcb.run_tests(one, problem, SandboxLimits(timeout_s=2)).passed
    wrong = one.replace("[x + 1]", "[x]")
    assert lcb.run_tests(wrong, problem, SandboxLimits(timeout_s=2)).verdict == "wrong_answer"
    two = one.replace("[x + 1]", "[x + 1, x]")  # lcb_runner: the truth value of two elements raises
    assert lcb.run_tests(two, problem, SandboxLimits(timeout_s=2)).verdict == "runtime_error"


def test_lcb_the_official_preset_has_no_address_space_cap() -> None:
    """A correct program that reserves 1.3 GB: over snapeval's default 1 GiB address space, within the
    official preset's limits (no RLIMIT_AS, as lcb_runner; the cgroup of 8 GiB is the safety net)."""
    (cfg,) = composed_sweep(None, "+protocol=livecodebench_official")
    code = "reserve = bytearray(1_300_000_000)\nprint(int(input()) + 1)"
    assert lcb.run_tests(code, ADD_ONE, SandboxLimits(timeout_s=5)).verdict in ("memory", "runtime_error")
    task = lcb.LiveCodeBench(cfg["task"])
    assert task.limits.address_space_bytes is None
    assert lcb.run_tests(code, ADD_ONE, task.limits).passed


def test_lcb_the_official_stop_ends_the_scored_text() -> None:
    """vLLM stops at "###" (lcb_runner's stop) and drops it: text after it is never scored (the runner
    stops once the answer holds it, see below; an answer stored with text after it scores the same)."""
    (cfg,) = composed_sweep(None, "+protocol=livecodebench_official")
    task = lcb.LiveCodeBench(cfg["task"])
    row = {**ADD_ONE, "platform": "atcoder"}
    good = "```python\nprint(int(input()) + 1)\n```\n"
    after = "### Explanation\n```python\nprint(0)\n```\n"  # the last fenced block, unless cut
    assert task.score_row(row, good + after)["passed"] == 1.0
    plain = lcb.LiveCodeBench({**cfg["task"], "stop": []})
    assert plain.score_row(row, good + after)["passed"] == 0.0
    assert cut_at_stop("a##b###c###", ["###", "c"]) == "a##b"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (a stop string spans several tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: index for index, char in enumerate("<>#abc \n")}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<")


def test_generation_stops_once_the_decoded_answer_holds_a_stop_string() -> None:
    """The runner's check after each token (lcb_runner's vLLM ``stop``): "###" over three tokens."""
    tokenizer = char_tokenizer()
    should_stop = stop_check(tokenizer, ["###"])
    ids = tokenizer("ab ## c\n###a", add_special_tokens=False)["input_ids"]
    stopped_at = next(n for n in range(1, len(ids) + 1) if should_stop(ids[:n]))
    assert tokenizer.decode(ids[:stopped_at]) == "ab ## c\n###"
    assert stop_check(tokenizer, []) is None
