"""Hostile data files, rows and sandbox settings end in one line naming the field, before any model loads.

Each case goes through the front door's checks in-process (:func:`snapeval.__main__.check_before_hydra`,
which ``python -m snapeval`` runs before Hydra starts); the two that would hang or exhaust memory
without their check (a FIFO, ``/dev/zero``) run as real commands, with a timeout and a memory cap, where
``import torch`` fails: their error comes before torch could load. Rows are built here, so no test needs
the shared data.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import resource
import socket
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from snapeval.configs.compose import compose_config
from snapeval.errors import SnapevalError
from snapeval.sandbox import SandboxLimits
from snapeval.tasks import livecodebench as lcb
from snapeval.tasks import load_task
from snapeval.tasks.base import MAX_CHARS_PER_TOKEN
from snapeval.tasks.rows import MAX_DATA_BYTES
from tests.test_bad_inputs import refusal

FIELD = "task.metadata.data_path"
AIME_ROW = {"id": 60, "problem": "Find the remainder when $2^{10}$ is divided by 1000.", "answer": "024"}
ROOM = 8192 - 512  # the default model's window less AIME's max_new_tokens: the tokens a prompt may take


def rows_file(tmp_path: Path, rows: list[dict[str, Any]], name: str = "rows.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return f"{FIELD}={path}"


def lcb_row(question_id: str = "abc365_b", **fields: Any) -> dict[str, Any]:
    """A LiveCodeBench row as the Hub stores it: one stdin test, public."""
    tests = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    row = {
        "question_title": "",
        "question_content": "Print A+B.",
        "platform": "atcoder",
        "question_id": question_id,
        "contest_id": "abc365",
        "contest_date": "2024-08-03T00:00:00",
        "starter_code": "",
        "difficulty": None,
        "public_test_cases": json.dumps(tests),
        "private_test_cases": "[]",
        "metadata": "{}",
    }
    return {**row, **fields}


def longbench_row(row_id: str) -> dict[str, Any]:
    choices = {f"choice_{letter}": letter.lower() for letter in "ABCD"}
    return {"_id": row_id, "question": "Which?", "answer": "A", "context": "text", **choices}


def command(tmp_path: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess[str]:
    """``python -m snapeval <overrides>`` in ``env``, ended after 60 s and held to 4 GiB of address space
    (a hang, or reading a device whole, fails the test without taking the machine's memory)."""

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    args = [sys.executable, "-m", "snapeval", f"run.db={tmp_path / 'db.sqlite'}", *overrides]
    return subprocess.run(
        args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, preexec_fn=cap_memory
    )


@pytest.mark.parametrize("kind", ["/dev/zero", "FIFO"])
def test_a_device_or_a_fifo_ends_before_torch_as_a_command(tmp_path, torch_refused, kind):
    """``/dev/zero`` was read whole (MemoryError) and a FIFO without a writer blocked forever: both are
    now refused unopened, in one line, exit code 2, before torch could load."""
    data = Path("/dev/zero") if kind == "/dev/zero" else tmp_path / "rows.jsonl"
    if kind == "FIFO":
        os.mkfifo(data)
    result = command(tmp_path, torch_refused, "task=aime24", f"{FIELD}={data}")
    what = "a character device" if kind == "/dev/zero" else "a FIFO"
    assert (result.returncode, result.stderr) == (
        2,
        f"error: {FIELD}: {data} is not a regular file but {what}\n",
    )


def test_a_file_over_the_size_cap_is_refused_unread(tmp_path):
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as file:  # sparse: its size without its bytes
        file.truncate(MAX_DATA_BYTES + 1)
    assert refusal(tmp_path, "task=aime24", f"{FIELD}={huge}") == (
        f"{FIELD}: {huge} has {MAX_DATA_BYTES + 1:,} bytes, over the 2 GiB a data file may have"
    )


def test_a_folder_whose_data_file_is_a_socket_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    with socket.socket(socket.AF_UNIX) as server:  # opening it would fail: refused by its kind first
        server.bind(str(tmp_path / "data" / "rows.jsonl"))
        message = refusal(tmp_path, "task=aime24", f"{FIELD}={tmp_path / 'data'}")
    where = tmp_path / "data" / "rows.jsonl"
    assert message == f"{FIELD}: {where} is not a regular file but a socket or another special file"


def test_a_row_too_long_for_the_window_is_refused_before_any_tokenizer(tmp_path, monkeypatch):
    """A 50 MB row was tokenized (19.4M tokens, 87 s) before its error; by its characters alone (2.5M
    here, over 7,680 tokens x 256) it is refused at once."""

    def no_tokenizer(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a tokenizer was loaded")

    monkeypatch.setattr("snapeval.models.load_tokenizer", no_tokenizer)
    long_row = {**AIME_ROW, "id": 61, "problem": "Find x. " * 312_500}
    message = refusal(tmp_path, "task=aime24", rows_file(tmp_path, [AIME_ROW, long_row]))
    chars = len("Find x. " * 312_500) + len(
        "\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    assert message.startswith(
        f"{FIELD}: row 2 (id 61): its prompt has {chars:,} characters, more than the 7,680 tokens of "
        "model.max_context 8192 - task.max_new_tokens 512 hold (256 a token at most)"
    )


def test_only_prompts_that_cannot_fit_are_refused_by_their_size() -> None:
    task = load_task(compose_config("task=aime24")["task"], seed=0)
    template = len(task.user_text({"problem": ""}))
    fits = {**AIME_ROW, "problem": "x" * (ROOM * MAX_CHARS_PER_TOKEN - template)}
    task.check_fits([fits], 8192)  # at the bound: left to the tokenizer
    with pytest.raises(SnapevalError, match=r"^task.metadata.data_path: row 1 \(id 60\): its prompt has"):
        task.check_fits([{**fits, "problem": fits["problem"] + "x"}], 8192)
    middle = load_task(compose_config("task=aime24", "task.truncation=middle")["task"], seed=0)
    middle.check_fits([{**fits, "problem": fits["problem"] * 2}], 8192)  # cut in the middle, not refused


@pytest.mark.parametrize(
    "fields,expected",
    [
        (
            {"private_test_cases": "aGVsbG8="},  # base64 of b"hello": not compressed
            "private_test_cases: neither a JSON list of tests nor the Hub's compressed one (zlib.error: "
            "Error -3 while decompressing data: incorrect header check)",
        ),
        (
            {"public_test_cases": "not json"},
            "public_test_cases: neither a JSON list of tests nor the Hub's compressed one (binascii.Error: "
            "Incorrect padding)",
        ),
        (
            {"public_test_cases": "[]", "private_test_cases": "[]"},
            "public_test_cases and private_test_cases: no tests",
        ),
        ({"public_test_cases": '[{"input": "1"}]'}, "public_test_cases: must be a list of tests, each with"),
        (
            {"metadata": '{"func_name": "f"}', "public_test_cases": '[{"input": "1", "output": "[1,"}]'},
            "public_test_cases: test 1's output is not JSON (a functional problem's result)",
        ),
        ({"metadata": "[1]"}, "metadata: must be a JSON object"),
    ],
    ids=["private not compressed", "public not JSON", "no tests", "no output", "result not JSON", "metadata"],
)
def test_livecodebench_rows_with_unusable_tests_are_refused_when_read(tmp_path, fields, expected):
    data = rows_file(tmp_path, [lcb_row("abc365_a"), lcb_row(**fields)])
    message = refusal(tmp_path, "task=livecodebench", data)
    assert message.startswith(
        f"{FIELD}: {tmp_path / 'rows.jsonl'}, row 2 (question_id 'abc365_b'): {expected}"
    )


def test_hub_compressed_private_tests_are_read() -> None:
    tests = json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}])
    packed = base64.b64encode(zlib.compress(pickle.dumps(tests))).decode()
    row = lcb_row(public_test_cases="[]", private_test_cases=packed)
    assert lcb.cases.tests_problem(row) is None
    assert lcb.parse_tests(row) == [lcb.CodeTest("1 2\n", "3\n")]


def test_grading_a_row_without_tests_is_one_line() -> None:
    with pytest.raises(SnapevalError, match=r"^task.metadata.data_path: problem 'abc365_b' has no tests$"):
        lcb.run_tests("print(3)", lcb_row(public_test_cases="[]"))


@pytest.mark.parametrize("answer", [{"a": 2}, [4], None, 1000, -1, "1000", "7.0", 73.0, True, "", " 73"])
def test_an_aime_gold_answer_that_is_no_aime_answer_is_refused(tmp_path, answer):
    message = refusal(
        tmp_path, "task=aime24", rows_file(tmp_path, [AIME_ROW, {**AIME_ROW, "id": 61, "answer": answer}])
    )
    assert message == (
        f"{FIELD}: {tmp_path / 'rows.jsonl'}, row 2 (id 61): answer must be an integer 0-999 or a string of "
        f"one (AIME), got {answer!r}"
    )


@pytest.mark.parametrize("answer", [0, 999, "025", "7"])
def test_aime_gold_answers_as_integers_or_their_digits_are_read(answer):
    task = load_task(compose_config("task=aime24")["task"], seed=0)
    assert task.row_problem({**AIME_ROW, "answer": answer}) is None


@pytest.mark.parametrize(
    "task,rows,label",
    [
        ("aime24", [AIME_ROW, {**AIME_ROW, "answer": "25"}], "id 60"),
        ("aime24", [AIME_ROW, {**AIME_ROW, "id": "60"}], "id '60'"),  # the sample ids would collide
        ("longbench_v2", [longbench_row("a"), longbench_row("b"), longbench_row("a")], "_id 'a'"),
        ("livecodebench", [lcb_row(), lcb_row("abc365_a"), lcb_row()], "question_id 'abc365_b'"),
    ],
)
def test_two_rows_with_one_id_are_refused(tmp_path, task, rows, label):
    message = refusal(tmp_path, f"task={task}", rows_file(tmp_path, rows))
    assert message == (
        f"{FIELD}: {tmp_path / 'rows.jsonl'}, rows 1 and {len(rows)} have the same {label}: "
        "each problem must be listed once"
    )


def test_an_aime_row_without_an_id_is_refused(tmp_path):
    message = refusal(tmp_path, "task=aime24", rows_file(tmp_path, [{"problem": "x", "answer": "1"}]))
    assert message == f"{FIELD}: {tmp_path / 'rows.jsonl'}, row 1: missing field(s) id"


@pytest.mark.parametrize(
    "override,expected",
    [
        (
            "+task.sandbox={timeout_s: abc}",
            "task.sandbox.timeout_s: must be a number of seconds in (0, 86400]",
        ),
        ("+task.sandbox.timeout_s=-1", "task.sandbox.timeout_s: must be a number of seconds in (0, 86400]"),
        ("+task.sandbox={total_timeout_s: 0}", "task.sandbox.total_timeout_s: must be a number of seconds"),
        (
            "+task.sandbox={address_space_bytes: 1}",
            "task.sandbox.address_space_bytes: must be an integer >= 268435456 (256 MiB",
        ),
        ("+task.sandbox.max_processes=0", "task.sandbox.max_processes: must be an integer >= 2"),
        ("+task.sandbox={max_file_bytes: 1.5}", "task.sandbox.max_file_bytes: must be an integer >= 1048576"),
        ("+task.sandbox={max_disk_bytes: 0}", "task.sandbox.max_disk_bytes: must be an integer >= 1048576"),
        (
            "+task.sandbox={total_memory_bytes: true}",
            "task.sandbox.total_memory_bytes: must be an integer >=",
        ),
        ("+task.sandbox={memory: 1}", "task.sandbox: unknown key 'memory'; SandboxLimits takes timeout_s, "),
    ],
)
def test_bad_sandbox_settings_are_refused_field_by_field(tmp_path, override, expected):
    assert refusal(tmp_path, "task=livecodebench", rows_file(tmp_path, [lcb_row()]), override).startswith(
        expected
    )


def test_sane_sandbox_settings_and_the_official_presets_are_taken() -> None:
    cfg = compose_config("task=livecodebench", "+task.sandbox={timeout_s: 2, max_processes: 8}")
    assert load_task(cfg["task"], seed=0).limits == SandboxLimits(timeout_s=2, max_processes=8)
    official = compose_config("+protocol=livecodebench_official")
    limits = load_task(official["task"], seed=0).limits
    assert (limits.address_space_bytes, limits.total_memory_bytes) == (None, 8 << 30)
