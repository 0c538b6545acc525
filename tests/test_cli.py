"""`python -m snapeval` on bad input: one clear line naming the field, exit code 2, no traceback.

The cases run in-process through the front door's checks (:func:`snapeval.__main__.check_before_hydra`,
which the command runs before Hydra starts); the schema's cases run once more in one interpreter where
torch cannot be imported, and one case as the real command, for its exit code and its single line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from snapeval.__main__ import check_before_hydra
from snapeval.errors import SnapevalError

SCHEMA = [  # refused by the config's declarations, before torch loads
    (["model=nonexistent"], "model: unknown option 'nonexistent'; choose one of"),
    (["task=nonexistent"], "task: unknown option 'nonexistent'; choose one of aime24"),
    (["cache=snapstream,nonexistent"], "cache: unknown option 'nonexistent'; choose one of full"),
    (["seed=abc"], "seed: must be an integer >= 0, got 'abc'"),
    (["seed=-1"], "seed: must be an integer >= 0, got -1"),
    (["generation.temperature=abc"], "generation.temperature: must be a number in (0, 100], got 'abc'"),
    (["generation.top_p=5"], "generation.top_p: must be a number in (0, 1], got 5.0"),
    (["generation.do_sample=maybe"], "generation.do_sample: must be one of True, False, got 'maybe'"),
    (["run.limit=true"], "run.limit: must be an integer >= 1 or null, got True"),
    (["run.limit=0"], "run.limit: must be an integer >= 1 or null, got 0"),
    (["run.limit=1.5"], "run.limit: must be an integer >= 1 or null, got 1.5"),
    (["run.shard=4/4"], "run.shard: must be i/n with 0 <= i < n (say 0/4), or null, got '4/4'"),
    (["run.compile=fast"], "run.compile: must be one of auto, on, off, graphs, got 'fast'"),
    (
        ["run.decode_attention=flash"],
        "run.decode_attention: must be one of auto, grouped, split, got 'flash'",
    ),
    (["task.max_new_tokens=null"], "task.max_new_tokens: must be an integer >= 1, got None"),
    (["task.context_length=-5"], "task.context_length: must be an integer >= 16, got -5"),
    (["task.context_length=10000000"], "task.context_length: 10000000 tokens do not fit the model's"),
    (["model.dtype=int4"], "model.dtype: must be one of auto, float32, bfloat16, float16, got 'int4'"),
    (["+cache.budgt=5"], "cache.budgt: unknown key; full takes budget, kv_dtype, method, prefill_chunk,"),
    (
        ["+task.limt=1"],
        "task.limt: unknown key; task ruler_passkey has compression, context_length, kind, max_new_tokens,",
    ),
    (["task.contxt_length=5"], "task.contxt_length: unknown key; task has compression, context_length,"),
    (
        ["+foo=1"],
        "foo: unknown key; the config has cache, engine, generation, grid, hardware, job, memory, model,",
    ),
    (["memory.fo=1"], "memory.fo: no such key (check its spelling; +KEY=... adds a new one)"),
    (["cache=snapkv", "cache.window=abc"], "cache.window: must be an integer >= 1, got 'abc'"),
    (["task=livecodebench", "task.stop=3"], "task.stop: must be a list, got 3"),
    (["model.device=cuda"], "model.device: CUDA is not available on this machine"),
    (
        ["task=livecodebench", "task.metadata.start_date=notadate"],
        "task.metadata.start_date: must be an ISO date (2024-08-01) or null, got 'notadate'",
    ),
    (
        ["task=livecodebench", "+task.metadata.relase=v6"],
        "task.metadata.relase: unknown key; task.metadata has code_extraction, data_path, end_date,",
    ),
    (
        ["task=longbench_v2_cot", "task.answer_pass.max_new_tokens=0"],
        "task.answer_pass.max_new_tokens: must be an integer >= 1, got 0",
    ),
    (
        ["+protocol=livecodebench_official", "task=ruler_passkey"],
        "protocol: livecodebench_official is a protocol of task livecodebench, not of task ruler_passkey",
    ),
]
ENGINE = [  # refused by the engine's or the task's own checks, still before any model loads
    (["cache=snapstream", "cache.budget=50"], "cache.budget: must be an integer larger than"),
    (["cache=snapkv", "cache.kernel=4"], "cache.kernel: must be a positive odd integer"),
    (["cache=snapkv", "cache.pooling=median"], "cache.pooling: must be one of max, avg, got 'median'"),
    (
        ["task=longbench_v2_cot", "task.answer_pass.prompt=snapeval.tasks.longbench_v2.nope"],
        "task.answer_pass.prompt: cannot import 'snapeval.tasks.longbench_v2.nope'",
    ),
]


def refusal(tmp_path: Path, args: list[str]) -> str:
    with pytest.raises(SnapevalError) as info:
        check_before_hydra([f"run.db={tmp_path / 'db.sqlite'}", *args])
    return str(info.value)


@pytest.mark.parametrize("args,expected", SCHEMA + ENGINE, ids=[" ".join(a) for a, _ in SCHEMA + ENGINE])
def test_bad_config_is_refused_in_one_line_naming_the_field(args, expected, tmp_path):
    message = refusal(tmp_path, args)
    assert message.startswith(expected) and "\n" not in message, message
    if (args, expected) in SCHEMA:
        assert not (tmp_path / "db.sqlite").exists()  # nothing started


PROBE = """
import json, sys
from snapeval.__main__ import check_before_hydra
from snapeval.errors import SnapevalError
refused = []
for args in json.loads(sys.argv[1]):
    try:
        check_before_hydra(args)
    except SnapevalError as exc:
        refused.append(str(exc))
print(json.dumps(refused))
"""


def test_the_schema_refuses_before_torch_can_load(tmp_path, torch_refused):
    """Every schema case, in an interpreter where ``import torch`` fails: none of them needed it."""
    cases = [[f"run.db={tmp_path / 'db.sqlite'}", *args] for args, _ in SCHEMA]
    probe = [sys.executable, "-c", PROBE, json.dumps(cases)]
    result = subprocess.run(probe, capture_output=True, text=True, timeout=300, env=torch_refused)
    assert result.returncode == 0, result.stderr
    refused = json.loads(result.stdout)
    expected = [message for _, message in SCHEMA]
    assert [message[: len(prefix)] for message, prefix in zip(refused, expected, strict=True)] == expected


def test_the_command_exits_2_with_one_line(tmp_path, torch_refused):
    result = subprocess.run(
        [sys.executable, "-m", "snapeval", f"run.db={tmp_path / 'db.sqlite'}", "generation.top_p=5"],
        capture_output=True,
        text=True,
        timeout=120,
        env=torch_refused,
    )
    assert (result.returncode, result.stderr) == (
        2,
        "error: generation.top_p: must be a number in (0, 1], got 5.0\n",
    )
