"""`python -m snapeval` on bad input: one clear line, non-zero exit, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


def snapeval(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snapeval", f"db.url={tmp_path / 'db.sqlite'}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args,expected",
    [
        (["model=nonexistent"], "smollm2-135m"),
        (["task=nonexistent"], "ruler_passkey"),
        (["cache=nonexistent"], "snapstream"),
        (["task.limit=0"], "error: task.limit: must be a positive integer"),
        (["task.context_length=-5"], "error: task.context_length: must be a positive integer"),
        (["cache=snapstream", "cache.budget=50"], "error: cache.budget: must be an integer larger than"),
        (["cache=snapkv", "cache.kernel=4"], "error: cache.kernel: must be a positive odd integer"),
        (["cache=snapkv", "cache.pooling=median"], "error: cache.pooling: unknown pooling 'median'"),
        (["task.contxt_length=5"], "contxt_length"),
        (
            ["task=longbench_v2_cot", "task.answer_pass.prompt=snapeval.tasks.longbench_v2.nope"],
            "error: task.answer_pass.prompt: cannot import 'snapeval.tasks.longbench_v2.nope'",
        ),
        (
            ["task=longbench_v2_cot", "task.answer_pass.max_new_tokens=0"],
            "error: task.answer_pass.max_new_tokens: must be a positive integer",
        ),
    ],
)
def test_bad_config_fails_in_one_clear_message(args, expected, tmp_path):
    result = snapeval(*args, tmp_path=tmp_path)
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
