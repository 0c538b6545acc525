"""Old spellings of config keys (the legacy-key table, :mod:`snapeval.configs.legacy`): a command line
that uses them means the same run, and a database written before the keys moved resumes after
``python -m snapeval.results migrate`` without recomputing a sample.

``tests/data/db_before_typed_config.sqlite`` was written by snapeval before the keys moved, by the three
commands of :data:`OLD_COMMANDS` (2 + 2 + 4 samples of ruler_passkey on the embedded 135M model).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from snapeval.configs.compose import compose_config
from snapeval.configs.legacy import RENAMED, rewrite, upgrade
from snapeval.results import ResultsDB, identity
from snapeval.results.__main__ import main as results_main
from snapeval.results.identity import config_hash, upgraded

OLD_DB = Path(__file__).parent / "data" / "db_before_typed_config.sqlite"

OLD_COMMANDS = [  # as they were run, with the number of samples each stored
    (["task.limit=2", "cache=snapstream", "cache.budget=256"], 2),
    (["task.limit=2", "cache=full"], 2),
    (
        [
            "task.limit=2",
            "cache=snapkv",
            "cache.budget=300",
            "generation.max_new_tokens=16",
            "generation.do_sample=true",
            "generation.num_samples=2",
            "task.num_samples=20",
        ],
        4,
    ),
]
NEW_COMMANDS = [  # the same runs, spelled as today
    ["run.limit=2", "cache=snapstream", "cache.budget=256"],
    ["run.limit=2", "cache=full"],
    [
        "run.limit=2",
        "cache=snapkv",
        "cache.budget=300",
        "task.max_new_tokens=16",
        "generation.do_sample=true",
        "generation.num_samples=2",
        "task.num_prompts=20",
    ],
]


def digest(db_path: Path, overrides: list[str]) -> str:
    """The config hash the runner stores a single run of ``overrides`` under."""
    cfg = compose_config(*rewrite(overrides), f"run.db={db_path}", "run.progress=false")
    return identity(cfg)[1]


def test_an_old_command_line_is_rewritten_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    old = ["task.limit=2", "+db.url=x.sqlite", "~progress", "generation.max_new_tokens=16", "seed=1"]
    assert rewrite(old) == [
        "run.limit=2",
        "+run.db=x.sqlite",
        "~run.progress",
        "task.max_new_tokens=16",
        "seed=1",
    ]
    notes = capsys.readouterr().err.splitlines()
    assert notes == [
        "note: task.limit is now run.limit",
        "note: db.url is now run.db",
        "note: progress is now run.progress",
        "note: generation.max_new_tokens is now task.max_new_tokens",
    ]
    for (old_command, _), new_command in zip(OLD_COMMANDS, NEW_COMMANDS, strict=True):
        assert compose_config(*rewrite(old_command)) == compose_config(*new_command)


def has(config: dict, path: str) -> bool:
    head, _, rest = path.partition(".")
    return head in config and (not rest or (isinstance(config[head], dict) and has(config[head], rest)))


def test_the_table_maps_old_keys_to_keys_of_today() -> None:
    today = compose_config()
    assert all(has(today, new) and not has(today, old) for old, new in RENAMED.items())


def test_a_stored_config_moves_its_old_keys() -> None:
    old = {
        "seed": 0,
        "progress": False,
        "task": {
            "name": "t",
            "limit": 2,
            "shard": None,
            "num_samples": 20,
            "max_new_tokens": 32,
            "family": "x",
        },
        "generation": {
            "max_new_tokens": 16,
            "batch_size": 8,
            "compile": "auto",
            "draw_batch": 4,
            "top_p": 1.0,
        },
        "db": {"url": "x.sqlite", "lease_s": 120},
    }
    assert upgrade(old) == {
        "seed": 0,
        "task": {"name": "t", "num_prompts": 20, "max_new_tokens": 16},
        "generation": {"top_p": 1.0},
        "run": {
            "progress": False,
            "limit": 2,
            "batch_size": 8,
            "compile": "auto",
            "db": "x.sqlite",
            "lease_s": 120,
        },
    }
    unset = upgrade({"task": {"max_new_tokens": 32}, "generation": {"max_new_tokens": None}})
    assert unset == {"task": {"max_new_tokens": 32}}  # null meant the task's own length


def test_a_whole_number_given_to_a_float_field_migrates_to_the_hash_of_today() -> None:
    """Before the typed tree, ``cache.ratio=1`` and ``generation.temperature=1`` were stored as integers;
    composing them today gives floats, so migrate stores floats and the run resumes under today's hash."""
    overrides = ["cache=snapkv", "cache.budget=null", "cache.ratio=1", "generation.do_sample=true"]
    today = compose_config(*overrides, "generation.temperature=1")
    stored, today_hash = identity(today)
    old = {**stored, "cache": {**stored["cache"], "ratio": 1}}
    old["generation"] = {**stored["generation"], "temperature": 1}
    assert config_hash(old) != today_hash
    assert config_hash(upgraded(old)) == today_hash
    assert type(upgraded(old)["cache"]["ratio"]) is float


def test_a_database_written_before_the_keys_moved_resumes_after_migrate(tmp_path: Path, capsys) -> None:
    db_path = tmp_path / "old.sqlite"
    shutil.copy(OLD_DB, db_path)
    hashes = [digest(db_path, command) for command in NEW_COMMANDS]
    with ResultsDB(db_path) as db:
        assert [len(db.done_sample_ids(digest)) for digest in hashes] == [0, 0, 0]  # not yet migrated
    assert results_main(["migrate", "--db", str(db_path)]) == 0
    assert capsys.readouterr().out == "migrated 3 run(s)\n"
    with ResultsDB(db_path) as db:
        done = [db.done_sample_ids(digest) for digest in hashes]
        assert [len(ids) for ids in done] == [count for _, count in OLD_COMMANDS]
        assert done[2] == {f"passkey-1024-0-{i}#{draw}" for i in range(2) for draw in range(2)}
        assert db.migrate() == 0  # a second migrate changes nothing
    assert [digest(db_path, command) for command, _ in OLD_COMMANDS] == hashes


@pytest.mark.slow
def test_a_migrated_run_computes_nothing(tmp_path: Path) -> None:
    """The runner itself, on the migrated database: every sample of the three runs is found done."""
    from snapeval.run import runner

    db_path = tmp_path / "old.sqlite"
    shutil.copy(OLD_DB, db_path)
    with ResultsDB(db_path) as db:
        db.migrate()
    for command, (_, count) in zip(NEW_COMMANDS, OLD_COMMANDS, strict=True):
        cfg = compose_config(*command, f"run.db={db_path}", "run.progress=false")
        (summary,) = runner.run(cfg)
        assert (summary.n, summary.computed) == (count, 0)
