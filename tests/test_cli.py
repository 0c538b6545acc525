"""`python -m snapeval` on bad input: one clear line, non-zero exit, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


def snapeval(*args: str, tmp_path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snapeval", f"run.db={tmp_path / 'db.sqlite'}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


HOSTILE = [
    (["model=nonexistent"], "error: model: unknown option 'nonexistent'; choose one of"),
    (["task=nonexistent"], "error: task: unknown option 'nonexistent'; choose one of aime24"),
    (["cache=snapstream,nonexistent"], "error: cache: unknown option 'nonexistent'; choose one of full"),
    (["seed=abc"], "error: seed: must be an integer >= 0, got 'abc'"),
    (
        ["generation.temperature=abc"],
        "error: generation.temperature: must be a number in (0, 100], got 'abc'",
    ),
    (["generation.top_p=5"], "error: generation.top_p: must be a number in (0, 1], got 5"),
    (["run.limit=true"], "error: run.limit: must be an integer >= 1 or null, got True"),
    (["run.limit=0"], "error: run.limit: must be an integer >= 1 or null, got 0"),
    (["task.context_length=-5"], "error: task.context_length: must be an integer >= 16, got -5"),
    (["task.context_length=10000000"], "error: task.context_length: 10000000 tokens do not fit the model's"),
    (
        ["+cache.budgt=5"],
        "error: cache.budgt: unknown key; full takes budget, method, ratio",
    ),
    (["+task.limt=1"], "error: task.limt: unknown key; task ruler_passkey has context_length, kind, limit"),
    (["task.contxt_length=5"], "error: task.contxt_length: no such key"),
    (["+foo=1"], "error: foo: unknown key; the config has"),
    (["model.device=cuda"], "error: model.device: CUDA is not available on this machine"),
    (
        ["task=livecodebench", "task.metadata.start_date=notadate"],
        "error: task.metadata.start_date: must be an ISO",
    ),
    (["cache=snapstream", "cache.budget=50"], "error: cache.budget: must be an integer larger than"),
    (["cache=snapkv", "cache.kernel=4"], "error: cache.kernel: must be a positive odd integer"),
    (["cache=snapkv", "cache.pooling=median"], "error: cache.pooling: unknown pooling 'median'"),
    (
        ["task=longbench_v2_cot", "task.answer_pass.prompt=snapeval.tasks.longbench_v2.nope"],
        "error: task.answer_pass.prompt: cannot import 'snapeval.tasks.longbench_v2.nope'",
    ),
    (
        ["task=longbench_v2_cot", "task.answer_pass.max_new_tokens=0"],
        "error: task.answer_pass.max_new_tokens: must be a positive integer",
    ),
]
SCHEMA_ERRORS = 16  # the first ones are refused by the schema, before torch loads


@pytest.mark.parametrize("args,expected", HOSTILE, ids=[" ".join(args) for args, _ in HOSTILE])
def test_bad_config_fails_in_one_clear_line_with_exit_code_2(args, expected, tmp_path, torch_refused):
    by_schema = HOSTILE.index((args, expected)) < SCHEMA_ERRORS  # checked before torch loads
    result = snapeval(*args, tmp_path=tmp_path, env=torch_refused if by_schema else None)
    assert result.returncode == 2
    assert result.stderr.startswith(expected) and result.stderr.count("\n") == 1, result.stderr
    if by_schema:
        assert not (tmp_path / "db.sqlite").exists()  # nothing started


def test_an_empty_data_file_is_one_clear_line(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = snapeval("task=aime24", f"task.metadata.data_path={empty}", tmp_path=tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"error: task.metadata.data_path: {empty} holds no rows\n"
