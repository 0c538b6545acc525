"""Prompts, answer extraction and scoring of AIME, LongBench-v2 and LiveCodeBench on real items."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib
from datetime import date
from functools import cache
from itertools import combinations
from typing import Any

import pytest

from snapeval.run.prompting import truncate_middle
from snapeval.sandbox import SandboxLimits
from snapeval.stats import pass_at_k
from snapeval.tasks import aime24 as aime
from snapeval.tasks import livecodebench as lcb
from snapeval.tasks import longbench_v2 as lb
from snapeval.tasks.aime_scorers import SCORERS
from snapeval.tasks.base import after_reasoning

from .paths import SHARED_DATA

DATA_DIR = SHARED_DATA


@cache
def load_jsonl(relative: str) -> list[dict[str, Any]]:
    path = DATA_DIR / relative
    if not path.exists():
        pytest.skip(f"benchmark data not found at {path} (set SNAPEVAL_DATA_DIR)")
    with path.open() as f:
        return [json.loads(line) for line in f]


def test_after_reasoning_keeps_the_text_after_the_last_think_end() -> None:
    assert after_reasoning("<think>a</think>b</think> c") == " c"
    assert after_reasoning("no trace") == "no trace"


# --- AIME -----------------------------------------------------------------------------------------


def test_aime_prompt_matches_the_qwq_evaluation_prompt() -> None:
    problems = {row["answer"]: row["problem"] for row in load_jsonl("aime24/test.jsonl")}
    qwq = {str(row["answer"]).zfill(3): row["prompt"] for row in load_jsonl("aime24/aime24.jsonl")}
    assert aime.build_prompt(problems["204"]) == qwq["204"]
    assert aime.build_prompt("What is 1+1?") == (
        "What is 1+1?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )


def test_aime_scores_every_real_gold_answer() -> None:
    for row in load_jsonl("aime24/test.jsonl"):
        gold = row["answer"]
        for scorer in SCORERS:
            output = f"<think>...</think>So the answer is $\\boxed{{{int(gold)}}}$."
            assert aime.score(output, gold, scorer) == {"acc": 1}, (scorer, gold)
            assert aime.score(f"\\boxed{{{int(gold) + 1}}}", gold, scorer)["acc"] == 0
            assert aime.score("I give up.", gold, scorer)["acc"] == 0


def test_aime_pass_at_1_averages_samples_then_problems() -> None:
    assert aime.pass_at_1([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        aime.pass_at_1([[1], []])


# --- LongBench-v2 ---------------------------------------------------------------------------------


@pytest.fixture
def lb_row() -> dict[str, Any]:
    return {
        "question": " Who wrote it? ",
        "choice_A": "Ann",
        "choice_B": "Bob",
        "choice_C": "Cy",
        "choice_D": "Di $Q$",
        "answer": "B",
        "context": "\nThe memo costs $5. Placeholders like $DOC$ and $Q$ stay verbatim.\n",
        "difficulty": "hard",
        "length": "short",
    }


def test_longbench_0shot_prompt_is_the_official_template(lb_row: dict[str, Any]) -> None:
    assert lb.build_prompt(lb_row) == (
        "Please read the following text and answer the question below.\n\n<text>\n"
        # pred.py's chained replaces: the document's "$Q$" becomes the question (its "$DOC$" stays,
        # filled before it), the choice's "$Q$" stays (filled after it)
        "The memo costs $5. Placeholders like $DOC$ and Who wrote it? stay verbatim.\n</text>\n\n"
        "What is the correct answer to this question: Who wrote it?\nChoices:\n"
        "(A) Ann\n(B) Bob\n(C) Cy\n(D) Di $Q$\n\n"
        'Format your response as follows: "The correct answer is (insert answer here)".'
    )


def test_longbench_cot_prompts_are_the_official_templates(lb_row: dict[str, Any]) -> None:
    first = lb.build_prompt(lb_row, cot=True)
    assert first.startswith("Please read the following text and answer the questions below.\n\n<text>\n")
    assert first.endswith("(D) Di $Q$\n\nLet\u2019s think step by step:")
    second = lb.build_cot_answer_prompt(lb_row, "\nBob signed the memo, so (B).\n")
    assert second == (
        "Please read the following text and answer the questions below.\n\n"
        "The text is too long and omitted here.\n\n"
        "What is the correct answer to this question: Who wrote it?\nChoices:\n"
        "(A) Ann\n(B) Bob\n(C) Cy\n(D) Di $Q$\n\n"
        "Let\u2019s think step by step: Bob signed the memo, so (B).\n\n"
        "Based on the above, what is the single, most likely answer choice? "
        'Format your response as follows: "The correct answer is (insert answer here)".'
    )


def test_longbench_prompt_embeds_a_real_document() -> None:
    row = load_jsonl("longbench_v2/longbench_v2_short.jsonl")[0]
    prompt = lb.build_prompt(row)
    assert f"<text>\n{row['context'].strip()}\n</text>" in prompt
    assert f"(D) {row['choice_D'].strip()}\n\nFormat your response" in prompt


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("The correct answer is (B)", "B"),
        ("After weighing the evidence, **The correct answer is (C)**.", "C"),
        ("The correct answer is D, because the report says so.", "D"),
        ("<think>The correct answer is (A)? No.</think>The correct answer is (B)", "A"),  # as pred.py
        ("The correct answer is (E)", None),
        ("I cannot determine the answer from the text.", None),
        ("", None),
    ],
)
def test_longbench_extracts_the_answer_letter(response: str, expected: str | None) -> None:
    assert lb.extract_answer(response) == expected


def test_longbench_truncates_the_middle_like_pred_py() -> None:
    tokens = list(range(10))
    assert truncate_middle(tokens, 4) == [0, 1, 8, 9]
    assert truncate_middle(tokens, 5) == [0, 1, 7, 8, 9]  # tokens[:5 // 2] + tokens[-5 // 2:]
    assert truncate_middle(tokens, 10) == tokens
    assert truncate_middle(tokens, 1) == [9]
    with pytest.raises(ValueError):
        truncate_middle(tokens, 0)


def test_longbench_scores_and_summarizes_real_items() -> None:
    rows = load_jsonl("longbench_v2/longbench_v2_short.jsonl")
    scored = [lb.score(f"The correct answer is ({row['answer']})", row) for row in rows[:10]]
    scored += [lb.score("The correct answer is unclear.", row) for row in rows[10:20]]
    assert scored[0] == {
        "acc": 1,
        "pred": rows[0]["answer"],
        "difficulty": rows[0]["difficulty"],
        "length": "short",
    }
    summary = lb.summarize(scored)
    assert summary["overall"] == 0.5
    assert summary["short"] == 0.5
    assert summary["medium"] is None and summary["long"] is None
    easy = [row["difficulty"] == "easy" for row in rows[:20]]
    assert summary["easy"] == sum(easy[:10]) / sum(easy)


# --- LiveCodeBench --------------------------------------------------------------------------------


@cache
def lcb_problem(question_id: str) -> dict[str, Any]:
    rows = load_jsonl("livecodebench/code_generation_lite_v5_public.jsonl")
    return next(row for row in rows if row["question_id"] == question_id)


LEAP_YEAR = "Y = int(input())\nprint(366 if (Y % 4 == 0 and Y % 100 != 0) or Y % 400 == 0 else 365)\n"
SECOND_LARGEST = """
def main():
    n = int(input())
    a = list(map(int, input().split()))
    print(sorted(range(n), key=lambda i: a[i])[-2] + 1)

if __name__ == "__main__":
    main()
"""
SNAKE = """
class Solution:
    def finalPositionOfSnake(self, n: int, commands: List[str]) -> int:
        moves = {"UP": (-1, 0), "DOWN": (1, 0), "LEFT": (0, -1), "RIGHT": (0, 1)}
        i = j = 0
        for command in commands:
            i, j = i + moves[command][0], j + moves[command][1]
        print("debug output is ignored")
        return i * n + j
"""
CHESSBOARD = """
class Solution:
    def checkTwoChessboards(self, coordinate1: str, coordinate2: str) -> bool:
        color = lambda square: (ord(square[0]) + int(square[1])) % 2
        return color(coordinate1) == color(coordinate2)
"""


def test_lcb_prompts_are_lcb_runners() -> None:
    stdin_row = {"question_content": "Add two numbers.", "starter_code": ""}
    assert lcb.generic_question(stdin_row) == (
        "### Question:\nAdd two numbers.\n\n### Format: Read the inputs from stdin solve the problem and "
        "write the answer to stdout (do not directly test on the sample inputs). Enclose your code within "
        "delimiters as follows. Ensure that when the python program runs, it reads the inputs, runs the "
        "algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n"
        "### Answer: (use the provided format with backticks)\n\n"
    )
    snake = lcb_problem("3533")
    assert lcb.generic_question(snake).endswith(
        "### Format: You will use the following starter code to write the solution to the problem and "
        f"enclose your code within delimiters.\n```python\n{snake['starter_code']}\n```\n\n"
        "### Answer: (use the provided format with backticks)\n\n"
    )
    system, user = lcb.build_messages(snake)
    assert system == {"role": "system", "content": lcb.SYSTEM_MESSAGE}
    assert user == {"role": "user", "content": lcb.generic_question(snake)}


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("Here you go:\n```python\nprint(1)\n```\nDone.", "print(1)"),
        (
            "Sample run:\n```\n$ python sol.py\n```\nFirst try:\n```python\nprint(1)\n```\n"
            "Fixed:\n```Python\nimport sys\nprint(2)\n```\nComplexity: O(n).",
            "import sys\nprint(2)",
        ),
        ("```python\nprint(1)\n```\nInput format:\n```text\n3 4\n```", "print(1)"),
        ("```py\nx = 1\n\n    print(x)\n```", "x = 1\n\n    print(x)"),
        (
            "<think>\n```python\nprint('draft')\n```\n</think>\n```python\nprint('final')\n```",
            "print('final')",
        ),
        ("<think>\n```python\nprint('draft')\n```\n</think>\nI am not sure how to solve it.", None),
        ("<think>\nLet me write\n```python\nprint('draft')\n```\nhmm", "print('draft')"),
        ("```python\nprint('truncated", None),
        ("print(1)", None),
    ],
)
def test_lcb_lenient_extraction_takes_the_last_python_block(output: str, expected: str | None) -> None:
    assert lcb.extract_code(output, "lenient") == expected


@pytest.mark.parametrize(
    ("question_id", "code"),
    [("abc365_a", LEAP_YEAR), ("abc365_b", SECOND_LARGEST), ("3533", SNAKE), ("3553", CHESSBOARD)],
    ids=["atcoder-leap-year", "atcoder-second-largest", "leetcode-snake", "leetcode-chessboard"],
)
def test_lcb_correct_solutions_pass(question_id: str, code: str) -> None:
    row = lcb_problem(question_id)
    report = lcb.run_tests(code, row)
    assert report.passed, report
    assert report.num_passed == report.num_tests == len(json.loads(row["public_test_cases"]))


@pytest.mark.parametrize(
    ("question_id", "code", "verdict"),
    [
        pytest.param("abc365_a", "print(365)", "wrong_answer", id="constant-output"),
        pytest.param("abc365_a", "print(int(input()) % 400)", "wrong_answer", id="wrong-formula"),
        pytest.param("abc365_b", SECOND_LARGEST.replace("[-2]", "[-1]"), "wrong_answer", id="off-by-one"),
        pytest.param("abc365_a", "Y = int(input())\nprint(366 / 0)", "runtime_error", id="exception"),
        pytest.param("abc365_a", "while True:\n    pass", "timeout", id="stdin-infinite-loop"),
        pytest.param("abc365_a", "print(len(bytearray(2**33)))", "memory", id="8gib-allocation"),
        pytest.param("3533", SNAKE.replace("i * n + j", "i + j"), "wrong_answer", id="functional-wrong"),
        pytest.param(
            "3553", CHESSBOARD.replace("checkTwoChessboards", "check"), "runtime_error", id="wrong-name"
        ),
        pytest.param(
            "3553",
            "class Solution:\n    def checkTwoChessboards(self, a, b):\n        return 'true'",
            "wrong_answer",
            id="string-instead-of-bool",
        ),
        pytest.param(
            "3553",
            "class Solution:\n    def checkTwoChessboards(self, a, b):\n        while True: pass",
            "timeout",
            id="functional-infinite-loop",
        ),
        pytest.param("3533", None, "no_code", id="no-code"),
    ],
)
def test_lcb_wrong_solutions_fail(question_id: str, code: str | None, verdict: str) -> None:
    report = lcb.run_tests(code, lcb_problem(question_id), SandboxLimits(timeout_s=1))
    assert (report.verdict, report.passed) == (verdict, False), report


def test_lcb_a_result_object_cannot_fake_equality() -> None:
    cheat = """
class Always:
    def __eq__(self, other):
        return True

class Solution:
    def finalPositionOfSnake(self, n, commands):
        return Always()
"""
    assert lcb.run_tests(cheat, lcb_problem("3533")).verdict == "wrong_answer"


def test_lcb_total_time_budget_stops_a_slow_program() -> None:
    slow = "import time\ntime.sleep(0.6)\nprint(365)"
    report = lcb.run_tests(slow, lcb_problem("abc365_a"), SandboxLimits(timeout_s=1, total_timeout_s=1))
    assert report.verdict == "timeout"
    assert report.num_passed <= 1


def test_lcb_stdout_comparison_is_lcb_runners() -> None:
    assert lcb.outputs_match("3  \n", "3\n")
    assert lcb.outputs_match("1 2\n3\n\n", "1 2\n3")
    assert lcb.outputs_match("Yes  \n No\n", "Yes\nNo")  # each line stripped, not only the text
    assert lcb.outputs_match("0.50 1e2\n", "0.5 100")  # compared as decimals
    assert not lcb.outputs_match("1 2 3", "1 2\n3")
    assert not lcb.outputs_match("Yes", "YES")
    assert not lcb.outputs_match("sNaN", "1")


def test_lcb_decodes_compressed_private_tests_without_running_pickled_code() -> None:
    private = [{"input": "5\n", "output": "6\n", "testtype": "stdin"}]
    compressed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private)))).decode()
    row = {"public_test_cases": "[]", "private_test_cases": compressed}
    assert lcb.parse_tests(row) == [lcb.CodeTest("5\n", "6\n")]
    hostile = base64.b64encode(zlib.compress(pickle.dumps(os.getcwd))).decode()
    with pytest.raises(pickle.UnpicklingError):
        lcb.parse_tests({"public_test_cases": "[]", "private_test_cases": hostile})


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    n, c = 6, 2
    for k in range(1, n + 1):
        draws = list(combinations([True] * c + [False] * (n - c), k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 10, 5) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)


def test_lcb_filters_by_contest_date() -> None:
    rows = load_jsonl("livecodebench/code_generation_lite_v5_public.jsonl")
    august = lcb.filter_by_date(rows, "2024-08-01", date(2024, 8, 31))
    assert august and all(row["contest_date"].startswith("2024-08") for row in august)
    later = lcb.filter_by_date(rows, start=date(2024, 9, 1))
    # As in lcb_runner, an end date means its midnight: later contests that day are left out.
    after_midnight = [row for row in rows if "2024-08-31T00:00:00" < row["contest_date"] < "2024-09"]
    assert after_midnight
    assert len(august) + len(after_midnight) + len(later) == len(rows)
    assert lcb.filter_by_date(rows, end="2024-08-03") == [
        r for r in rows if r["contest_date"] == "2024-08-03T00:00:00"
    ]
