"""Hostile inputs to the results database, the files the reading commands write, the accuracy gate and
the memory estimator: each ends in one line ``error: <field>: <what>`` with exit code 2 (or does what is
documented), and where the input alone decides, before torch loads.

In-process through the commands' own entry points (:func:`snapeval.__main__.check_before_hydra`, the
``main`` of ``snapeval.results``, ``snapeval.report``, ``snapeval.figures``, ``snapeval.commands.gate`` and
``snapeval.memory``); three subprocesses, in which ``import torch`` fails, show the refusals come before
torch, and one reads the first line of an export and closes the pipe. No test loads a model.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import IO

import pytest
import yaml

from snapeval.__main__ import check_before_hydra
from snapeval.commands.gate import main as gate_main
from snapeval.configs.compose import compose_config
from snapeval.errors import SnapevalError
from snapeval.figures.command import main as figures_main
from snapeval.memory import estimate, load_geometry, model_names
from snapeval.memory.catalogue import model_aliases, model_source
from snapeval.memory.cli import main as memory_main
from snapeval.memory.point import run_memory_point
from snapeval.report.__main__ import main as report_main
from snapeval.results import DEFAULT_DB, ResultsDB, files, load_memory
from snapeval.results.__main__ import main as results_main
from snapeval.results.schema import metadata

BINARY = bytes(range(256)) * 4  # byte 0x80 at offset 128 is the first that is not UTF-8
IN_MEMORY = "is an in-memory SQLite database (so are an empty value and :memory:): every result would be lost"


def front_door(*overrides: str) -> str:
    """The one-line refusal of ``python -m snapeval <overrides>`` before Hydra starts (no ``error: ``)."""
    with pytest.raises(SnapevalError) as info:
        check_before_hydra(list(overrides))
    assert "\n" not in str(info.value)
    return str(info.value)


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single line a command wrote to stderr, without its newline; nothing on stdout."""
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    return err.removesuffix("\n")


def sqlite_file(path: Path, *statements: str) -> Path:
    with sqlite3.connect(path) as conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()
    return path


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` with its bytes and mtime: WAL or journal files left behind show too."""
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def foreign(tmp_path: Path) -> dict[str, Path]:
    """SQLite files of other programs: one with its own ``runs`` table (and a row), one with ``notes``."""
    folder = tmp_path / "foreign"
    folder.mkdir()
    runs = "CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)"
    return {
        "runs": sqlite_file(folder / "runs.sqlite", runs, "INSERT INTO runs VALUES (1, 'mine')"),
        "notes": sqlite_file(folder / "notes.sqlite", "CREATE TABLE notes (text TEXT)"),
    }


RUNS_NOT_OURS = (
    "is not a snapeval database: its runs table lacks snapeval's columns created_at, status, config, "
    "config_hash (left as it is; give a new file)"
)
NOTES_NOT_OURS = (
    "holds no snapeval results but another program's tables (notes); left as it is: give a new file or "
    "a snapeval database"
)


# --- 1, 2: another program's SQLite file is refused and left as it is ---------------------------------


@pytest.mark.parametrize(("which", "reason"), [("runs", RUNS_NOT_OURS), ("notes", NOTES_NOT_OURS)])
def test_another_programs_database_is_refused_unchanged(foreign, which, reason, capsys):
    before = snapshot(foreign["runs"].parent)
    assert front_door(f"run.db={foreign[which]}") == f"run.db: {foreign[which]} {reason}"
    for argv in (["summary"], ["migrate"], ["export", "--csv", str(foreign[which]) + ".csv"]):
        assert results_main([*argv, "--db", str(foreign[which])]) == 2
        assert one_line(capsys) == f"error: --db: {foreign[which]} {reason}"
    assert snapshot(foreign["runs"].parent) == before


SNAPEVAL_TABLES = {table.name: set(table.columns.keys()) for table in metadata.sorted_tables}


def tables_in(path: Path) -> dict[str, set[str]]:
    """The tables of the SQLite file at ``path``, each with its columns."""
    with closing(sqlite3.connect(path)) as conn:
        names = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {name: {row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')} for name in names}


def used_as_snapevals(path: Path) -> None:
    """The database at ``path`` has every table and column of snapeval's, and stores and reads a run."""
    with ResultsDB(path) as db:
        run_id = db.start_run({"model": {"name": "m"}}, "new")
        assert db.add_sample(run_id, "new", {"sample_id": "s-0", "score": 1.0})
        db.finish_run(run_id)
        assert db.done_sample_ids("new") == {"s-0"}
        assert db.run_states()[-1]["status"] == "finished"
    tables = tables_in(path)
    assert all(columns <= tables.get(name, set()) for name, columns in SNAPEVAL_TABLES.items()), tables


def test_new_empty_old_or_half_made_snapeval_databases_are_used(tmp_path):
    """A new path, an empty file, snapeval's tables plus one of the user's (kept, with its rows), an old
    snapeval database (runs without its newer nullable columns, no claims: brought up to date, its run
    kept) and one another worker is still creating (tables missing: made) are snapeval's."""
    new, empty = tmp_path / "new" / "db.sqlite", sqlite_file(tmp_path / "empty.sqlite")
    with_extra = tmp_path / "extra.sqlite"
    ResultsDB(with_extra).close()
    sqlite_file(with_extra, "CREATE TABLE my_notes (text TEXT)", "INSERT INTO my_notes VALUES ('mine')")
    old = tmp_path / "old.sqlite"
    ResultsDB(old).close()
    sqlite_file(old, "ALTER TABLE runs DROP COLUMN expires_at", "DROP TABLE claims")
    assert "claims" not in tables_in(old) and "expires_at" not in tables_in(old)["runs"]
    with ResultsDB(old) as db:  # brought up to date
        db.finish_run(db.start_run({"model": {"name": "m"}}, "old"))
    half = tmp_path / "half.sqlite"
    ResultsDB(half).close()
    sqlite_file(half, "DROP TABLE samples", "DROP TABLE claims", "DROP TABLE memory_estimates")
    assert tables_in(half).keys() == SNAPEVAL_TABLES.keys() - {"samples", "claims", "memory_estimates"}
    for path in (new, empty, with_extra, old, half):
        used_as_snapevals(path)
    with closing(sqlite3.connect(with_extra)) as conn:
        assert conn.execute("SELECT text FROM my_notes").fetchall() == [("mine",)]
    with ResultsDB(old) as db:
        assert [(run["config_hash"], run["status"]) for run in db.run_states()] == [
            ("old", "finished"),
            ("new", "finished"),
        ]


# --- 3: an in-memory database loses every result --------------------------------------------------


IN_MEMORY_VALUES = [
    ("", "sqlite:///"),
    (":memory:", "sqlite:///:memory:"),
    ("sqlite://", "sqlite://"),
    ("sqlite:///:memory:", "sqlite:///:memory:"),
]


@pytest.mark.parametrize(("value", "shown"), IN_MEMORY_VALUES)
def test_an_in_memory_database_is_refused(value, shown, monkeypatch, capsys):
    monkeypatch.delenv("SNAPEVAL_DB", raising=False)
    ending = "when the command ends; give a file path or a server URL"
    assert front_door(f"run.db={value}") == f"run.db: {shown} {IN_MEMORY} {ending}"
    assert results_main(["summary", "--db", value]) == 2
    assert one_line(capsys) == f"error: --db: {shown} {IN_MEMORY} {ending}"


def test_an_in_memory_uri_is_refused():
    uri = "sqlite:///file::memory:?cache=shared&uri=true"
    with pytest.raises(SnapevalError) as info:
        ResultsDB(uri)
    assert str(info.value).startswith(f"run.db: {uri} {IN_MEMORY}")


def test_an_empty_snapeval_db_variable_is_named(monkeypatch, capsys):
    monkeypatch.setenv("SNAPEVAL_DB", "")
    assert front_door().startswith(f"run.db: sqlite:/// (from $SNAPEVAL_DB) {IN_MEMORY}")
    assert results_main(["summary"]) == 2
    assert one_line(capsys).startswith(f"error: --db: sqlite:/// (from $SNAPEVAL_DB) {IN_MEMORY}")


# --- 4: one variable, one database, for every command --------------------------------------------------


def test_snapeval_db_is_run_db_default_and_the_command_line_beats_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SNAPEVAL_DB", raising=False)
    assert compose_config()["run"]["db"] == str(DEFAULT_DB)
    monkeypatch.setenv("SNAPEVAL_DB", str(tmp_path / "env.sqlite"))
    assert compose_config()["run"]["db"] == str(tmp_path / "env.sqlite")
    assert compose_config(f"run.db={tmp_path / 'cli.sqlite'}")["run"]["db"] == str(tmp_path / "cli.sqlite")


def test_python_m_snapeval_and_the_reading_commands_share_snapeval_db(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SNAPEVAL_DB", str(tmp_path / "env.sqlite"))
    memory = ("job=memory", "memory.method=full", "memory.budget=null", "memory.context=1024")
    run_memory_point(compose_config(*memory))  # what python -m snapeval job=memory runs
    assert list(load_memory()["context"]) == [1024]  # read back from $SNAPEVAL_DB
    assert results_main(["summary"]) == 0
    assert capsys.readouterr().out == "no samples stored yet\n"  # not "no results database"
    assert not (tmp_path / "results").exists()


# --- 5: export --csv - ---------------------------------------------------------------------------------


def test_export_to_dash_writes_standard_output(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with ResultsDB(tmp_path / "db.sqlite") as db:
        run_id = db.start_run(
            {"model": {"name": "m"}, "task": {"name": "t"}, "cache": {"method": "full"}}, "h"
        )
        db.add_sample(run_id, "h", {"sample_id": "0", "output": "o", "score": 1.0})
    assert results_main(["export", "--db", "db.sqlite", "--csv", "-"]) == 0
    out, err = capsys.readouterr()
    header, row, end = out.split("\n")
    assert "sample_id" in header.split(",") and row.count(",") == header.count(",") and end == ""
    assert err == "" and not (tmp_path / "-").exists()


# --- 6, 7: the gate spec --------------------------------------------------------------------------------


def gate_spec(min_retained: object) -> dict:
    task, cache = ["task=ruler_passkey"], ["cache=snapkv"]
    return {"name": "g", "task": task, "cache": cache, "min_retained": min_retained, "min_n": 2}


def test_a_binary_gate_spec_names_spec(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(BINARY)
    assert gate_main(["--spec", str(spec), "--db", str(tmp_path / "db.sqlite"), "--no-run"]) == 2
    line = f"error: --spec: {spec}: not UTF-8 text (byte 0x80 at offset 128): give a YAML gate spec"
    assert one_line(capsys) == line


@pytest.mark.parametrize(("value", "shown"), [(".nan", "nan"), (".inf", "inf"), ("-.inf", "-inf")])
def test_a_threshold_that_is_not_finite_is_refused(value, shown, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump([gate_spec(0.8)]).replace("0.8", value))
    assert gate_main(["--spec", str(spec), "--db", str(tmp_path / "db.sqlite"), "--no-run"]) == 2
    assert one_line(capsys) == f"error: {spec}[0].min_retained: must be a number >= 0 and finite, got {shown}"


# --- 8: a config.json the estimator cannot read ---------------------------------------------------------

CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 64, "intermediate_size": 128}
BAD_CONFIGS = [
    ("binary", None, "model: {path} is not UTF-8 text (byte 0x80 at offset 128): give a config.json"),
    (
        "hidden",
        {"hidden_size": 4},
        "hidden_size: 4 is less than num_attention_heads (8): a head of 0 dimensions; set head_dim",
    ),
    (
        "layer_types",
        {"sliding_window": 4, "layer_types": 5},
        "layer_types: must be a list of attention kinds, one per layer, got 5",
    ),
    ("parameters", {"_num_parameters": "abc"}, "_num_parameters: must be a positive integer, got 'abc'"),
    ("deep", "[" * 100_000, "model: {path} is not valid JSON (nested too deeply)"),
]


def bad_config(folder: Path, name: str, fields: object) -> Path:
    path = folder / f"{name}.json"
    if fields is None:
        path.write_bytes(BINARY)
    else:
        path.write_text(
            fields if isinstance(fields, str) else json.dumps({**CONFIG, "vocab_size": 9, **fields})
        )
    return path


@pytest.mark.parametrize(("name", "fields", "expected"), BAD_CONFIGS, ids=[case[0] for case in BAD_CONFIGS])
def test_a_bad_model_config_names_its_field(name, fields, expected, tmp_path, capsys):
    path = bad_config(tmp_path, name, fields)
    assert memory_main([f"model={path}", "context=1024"]) == 2
    assert one_line(capsys) == "error: " + expected.format(path=path)


# --- 9: contexts beyond any model ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("context=10000001", "context: 10,000,001 tokens exceed the estimator's cap of 10,000,000"),
        ("context=" + "1" + "0" * 30, "context: 1e+30 tokens exceed the estimator's cap of 10,000,000"),
        ("budget=20000000", "budget: 20,000,000 tokens exceed the estimator's cap of 10,000,000"),
    ],
)
def test_a_context_beyond_the_cap_is_refused(argument, expected, capsys):
    arguments = {"context": "context=1024", "budget": "budget=1024"} | {argument.split("=")[0]: argument}
    assert memory_main(["model=llama-3.1-8b-instruct", *arguments.values()]) == 2
    assert one_line(capsys) == f"error: {expected}"


def test_a_context_beyond_the_models_positions_is_noted():
    note = (
        "context: 200,000 tokens exceed the model's 131,072 positions (max_position_embeddings): it runs "
        "that long only with rope scaling, if at all"
    )
    assert estimate("llama-3.1-8b-instruct", "h100", context=200_000).notes[0] == note
    assert not any(
        "positions" in note for note in estimate("llama-3.1-8b-instruct", "h100", context=131_072).notes
    )
    assert estimate("llama-3.1-8b-instruct", "h100", context=10_000_000).context == 10_000_000


# --- 10: short names, and every name when one is unknown -------------------------------------------------


def test_short_names_resolve_to_their_catalogue_entry(capsys):
    aliases = model_aliases()
    assert {"llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "gemma-3-12b", "deepseek-v2-lite"} <= set(aliases)
    for alias, name in aliases.items():
        geometry = load_geometry(alias)
        assert (geometry.name, geometry.source) == (name, model_source(name))
    assert memory_main(["model=llama-3.1-8b", "context=131072"]) == 0
    assert capsys.readouterr().out.startswith("llama-3.1-8b-instruct (GQA, 8.03B parameters) on sn40l")


def test_an_unknown_model_lists_every_name(capsys):
    assert memory_main(["model=llama-9", "context=1"]) == 2
    line = one_line(capsys)
    assert line.startswith("error: model: unknown model 'llama-9'; choose one of deepseek-r1, ")
    assert f"{', '.join(model_names())} (conf/model); short names " in line
    assert all(f"{alias} ({name})" in line for alias, name in model_aliases().items())
    assert len(model_names()) > 6


# --- before torch ------------------------------------------------------------------------------------


def test_the_refusals_come_before_torch(tmp_path, foreign, torch_refused):
    """A real ``python -m snapeval`` on another program's database, and the reading commands, the gate
    and the estimator on every hostile input above, in processes where ``import torch`` fails."""
    command = [sys.executable, "-m", "snapeval", f"run.db={foreign['runs']}"]
    front = subprocess.run(command, capture_output=True, text=True, env=torch_refused, timeout=120)
    assert (front.returncode, front.stderr) == (2, f"error: run.db: {foreign['runs']} {RUNS_NOT_OURS}\n")
    configs = [bad_config(tmp_path, name, fields) for name, fields, _ in BAD_CONFIGS]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump([gate_spec(0.8)]).replace("0.8", ".nan"))
    calls = [
        *(f"results(['summary', '--db', {str(foreign[which])!r}])" for which in ("runs", "notes")),
        "results(['summary', '--db', ':memory:'])",
        f"gate(['--spec', {str(spec)!r}, '--no-run'])",
        *(f"memory(['model={path}', 'context=1024'])" for path in configs),
        "memory(['model=llama-3.1-8b', 'context=99999999'])",
    ]
    script = (
        "import sys\nfrom snapeval.results.__main__ import main as results\n"
        "from snapeval.commands.gate import main as gate\nfrom snapeval.memory.cli import main as memory\n"
        f"codes = [{', '.join(calls)}]\nassert 'torch' not in sys.modules\nprint(codes)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=torch_refused, timeout=120
    )
    assert result.stdout == f"{[2] * len(calls)}\n", result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == len(calls) and all(line.startswith("error: ") for line in lines), lines


# --- round four: heads no model has ---------------------------------------------------------------------

IMPOSSIBLE_HEADS = [
    (8, "8 is more than num_attention_heads (4): each KV head serves at least one query head"),
    (0, "must be a positive integer, got 0"),
    (3, "3 does not divide num_attention_heads (4): KV heads serve equal groups of them"),
]


@pytest.mark.parametrize(("kv_heads", "expected"), IMPOSSIBLE_HEADS)
def test_kv_heads_no_model_has_are_refused(kv_heads, expected, tmp_path, capsys):
    path = bad_config(tmp_path, "heads", {"num_attention_heads": 4, "num_key_value_heads": kv_heads})
    assert memory_main([f"model={path}", "context=1024"]) == 2
    assert one_line(capsys) == f"error: num_key_value_heads: {expected}"


def test_impossible_heads_are_refused_before_torch(tmp_path, torch_refused):
    paths = [
        str(bad_config(tmp_path, f"heads-{kv}", {"num_attention_heads": 4, "num_key_value_heads": kv}))
        for kv, _ in IMPOSSIBLE_HEADS
    ]
    script = (
        "import sys\nfrom snapeval.memory.cli import main\n"
        f"codes = [main([f'model={{path}}', 'context=1024']) for path in {paths!r}]\n"
        "assert 'torch' not in sys.modules\nprint(codes)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=torch_refused, timeout=120
    )
    assert result.stdout == f"{[2] * len(paths)}\n", result.stderr
    expected = [f"error: num_key_value_heads: {message}" for _, message in IMPOSSIBLE_HEADS]
    assert result.stderr.splitlines() == expected


# --- 11: an output that is an input or a database ------------------------------------------------------


def scored_db(path: Path) -> Path:
    """A database with a full-cache run and a SnapKV run at budget 64, three scored samples each."""
    with ResultsDB(path) as db:
        for method, budget in (("full", None), ("snapkv", 64)):
            cache = {"method": method, "budget": budget}
            run_id = db.start_run({"model": {"name": "m"}, "task": {"name": "t"}, "cache": cache}, method)
            for sample in range(3):
                db.add_sample(run_id, method, {"sample_id": str(sample), "output": "o", "score": 1.0})
            db.finish_run(run_id)
    return path


COMMANDS = {
    "report": lambda db, out: report_main(["--db", str(db), "--out", str(out)]),
    "export": lambda db, out: results_main(["export", "--db", str(db), "--csv", str(out)]),
}
FIELDS = {"report": "--out", "export": "--csv"}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("target", ["itself", "a link to it", "a path through ..", "another database"])
def test_an_output_that_is_the_database_or_another_is_refused_unchanged(command, target, tmp_path, capsys):
    db = scored_db(tmp_path / "db.sqlite")
    other = sqlite_file(tmp_path / "other.sqlite", "CREATE TABLE notes (text TEXT)")
    (tmp_path / "link").symlink_to(db)
    out = {
        "itself": db,
        "a link to it": tmp_path / "link",
        "a path through ..": tmp_path / "missing" / ".." / "link",
        "another database": other,
    }[target]
    before = snapshot(tmp_path)
    assert COMMANDS[command](db, out) == 2
    reason = (
        "is a SQLite database"
        if target == "another database"
        else f"is the file of --db{'' if out == db else f' ({db})'}"
    )
    assert (
        one_line(capsys)
        == f"error: {FIELDS[command]}: {out} {reason}: writing it would destroy it; give another file"
    )
    assert snapshot(tmp_path) == before


def test_a_report_over_its_gate_spec_or_figures_over_the_database_are_refused(tmp_path, capsys):
    db = scored_db(tmp_path / "db.sqlite")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump([gate_spec(0.8)]))
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "accuracy_vs_budget.png").symlink_to(db)
    before = snapshot(tmp_path)
    assert report_main(["--db", str(db), "--gates", str(spec), "--out", str(spec)]) == 2
    line = f"error: --out: {spec} is the file of --gates: writing it would destroy it; give another file"
    assert one_line(capsys) == line
    assert figures_main(["--db", str(db), "--out", str(figures)]) == 2
    png = figures / "accuracy_vs_budget.png"
    assert one_line(capsys) == (
        f"error: --out: {png} is the file of --db ({db}): writing it would destroy it; give another file"
    )
    assert snapshot(tmp_path) == before


# --- 12: a full disk leaves the old file, and no temporary one ------------------------------------------


class FullDisk:
    """A file on a device with ``room`` bytes left: a write past it stores what fits, then fails."""

    def __init__(self, file: IO, room: int):
        self.file, self.room = file, room

    @classmethod
    def opened(cls, *args: object, **kwargs: object) -> FullDisk:
        """``open(...)`` on a device with 100 bytes left."""
        return cls(open(*args, **kwargs), 100)  # noqa: SIM115 - closed by __exit__

    def write(self, data: str | bytes) -> int:
        self.file.write(data[: self.room])
        if len(data) > self.room:
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return len(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.file, name)

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.file.close()


@pytest.mark.parametrize("command", ["report", "export", "figures"])
def test_a_full_disk_leaves_the_previous_file_and_no_temporary_one(command, tmp_path, monkeypatch, capsys):
    db = scored_db(tmp_path / "db.sqlite")
    folder = tmp_path / "out"
    folder.mkdir()
    out = (
        folder
        / {"report": "report.html", "export": "samples.csv", "figures": "accuracy_vs_budget.pdf"}[command]
    )
    out.write_text("the previous file\n")
    monkeypatch.setattr(files, "open", FullDisk.opened, raising=False)
    if command == "figures":
        assert figures_main(["--db", str(db), "--out", str(folder)]) == 2
        expected = f"error: --out: cannot write to {folder}: No space left on device"
    else:
        assert COMMANDS[command](db, out) == 2
        field, what = (("--out", "the report"), ("--csv", str(out)))[command == "export"]
        expected = f"error: {field}: cannot write {what}: No space left on device"
    assert capsys.readouterr().err == expected + "\n"
    assert [p.name for p in folder.iterdir()] == [out.name] and out.read_text() == "the previous file\n"


def test_outputs_replace_the_previous_file_whole(tmp_path, capsys):
    db = scored_db(tmp_path / "db.sqlite")
    csv, report = tmp_path / "samples.csv", tmp_path / "report.html"
    for path in (csv, report):
        path.write_text("the previous file\n")
        path.chmod(0o640)
    assert COMMANDS["export"](db, csv) == 0 and COMMANDS["report"](db, report) == 0
    capsys.readouterr()
    assert csv.read_text().startswith("model.name,") and report.read_text().startswith("<!DOCTYPE html>")
    assert {path.stat().st_mode & 0o777 for path in (csv, report)} == {0o640}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# --- 13: export --csv - | head ----------------------------------------------------------------------------


def test_export_into_a_pipe_closed_early_ends_quietly(tmp_path):
    """``export --csv - | head -1``: the rest goes nowhere, no traceback, exit 141 (SIGPIPE's)."""
    with ResultsDB(tmp_path / "db.sqlite") as db:
        run_id = db.start_run(
            {"model": {"name": "m"}, "task": {"name": "t"}, "cache": {"method": "full"}}, "h"
        )
        db.add_sample(run_id, "h", {"sample_id": "0", "output": "x" * 1_000_000, "score": 1.0})  # > a pipe
    command = [
        sys.executable,
        "-m",
        "snapeval.results",
        "export",
        "--db",
        str(tmp_path / "db.sqlite"),
        "--csv",
        "-",
    ]
    export = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert export.stdout.readline().startswith(b"model.name,")
    export.stdout.close()
    assert export.wait(timeout=120) == 141
    assert export.stderr.read() == b""


# --- 14: a run whose stored config is null ---------------------------------------------------------------


def test_a_run_whose_config_is_null_is_named(tmp_path, capsys):
    db = scored_db(tmp_path / "db.sqlite")
    sqlite_file(db, "UPDATE runs SET config = 'null' WHERE id = 2")
    line = (
        "error: --db: run 2 stores null as its config, not a mapping of settings, so its samples cannot be "
        "placed: a damaged row; restore the database from a copy, or delete the run and its samples"
    )
    assert report_main(["--db", str(db), "--out", str(tmp_path / "report.html")]) == 2
    assert one_line(capsys) == line
    for argv in (["summary"], ["export", "--csv", str(tmp_path / "samples.csv")]):
        assert results_main([*argv, "--db", str(db)]) == 2
        assert one_line(capsys) == line
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "samples.csv").exists()


# --- 15: reading an older database writes nothing ----------------------------------------------------------


def tables(path: Path) -> list[str]:
    """The tables of the SQLite file ``path``, read without a file beside it made or changed."""
    with sqlite3.connect(f"file:{path}?immutable=1", uri=True) as conn:
        names = sorted(row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    conn.close()
    return names


@pytest.mark.parametrize("storage", ["read-only", "writable"])
def test_an_older_database_is_read_without_a_write(storage, tmp_path, monkeypatch, capsys):
    """A database from before claims and decisions (and the runs' heartbeat) is reported, exported and
    summarized as it is. Root writes through chmod, so the folder's being read-only shows where the
    process is told so (``os.access``): the database is opened immutable, and not a byte of the folder
    changes; on writable storage SQLite's readers may leave WAL files beside it, the database unchanged."""
    folder = tmp_path / "db"
    folder.mkdir()
    db = scored_db(folder / "old.sqlite")
    sqlite_file(db, "DROP TABLE claims", "DROP TABLE decisions", "ALTER TABLE runs DROP COLUMN expires_at")
    assert tables(db) == ["memory_estimates", "runs", "samples"]
    before = snapshot(folder)
    if storage == "read-only":
        access = os.access

        def read_only_folder(path: str | os.PathLike[str], mode: int, **kwargs: object) -> bool:
            """``os.access``, which says ``folder`` cannot be written."""
            return not (mode & os.W_OK and Path(path) == folder) and access(path, mode, **kwargs)

        monkeypatch.setattr(os, "access", read_only_folder)
    db.chmod(0o444)
    folder.chmod(0o555)
    try:
        assert report_main(["--db", str(db), "--out", str(tmp_path / "report.html")]) == 0
        assert results_main(["export", "--db", str(db), "--csv", str(tmp_path / "samples.csv")]) == 0
        assert results_main(["summary", "--db", str(db)]) == 0
    finally:
        folder.chmod(0o755)
        db.chmod(0o644)
    assert "wrote 6 samples" in capsys.readouterr().out
    assert tables(db) == ["memory_estimates", "runs", "samples"]
    after = snapshot(folder)
    assert after[str(db)] == before[str(db)]
    if storage == "read-only":
        assert after == before
    else:
        assert set(after) <= {str(db), f"{db}-wal", f"{db}-shm"}


# --- 16: a damaged assembled weights file --------------------------------------------------------------


def test_a_damaged_assembled_weights_file_says_what_to_delete(tmp_path, monkeypatch):
    """What a package's ``assemble()`` (Gemma 3 270M's) raises on a truncated file is said for the command
    line: the file to delete, not a Python argument."""
    weights = tmp_path / "cache" / "model.gguf"
    package = tmp_path / "damaged_weights_package"
    package.mkdir()
    message = f"{weights} already exists with an unexpected sha256; pass overwrite=True to replace it"
    (package / "__init__.py").write_text(f"def assemble():\n    raise FileExistsError({message!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from snapeval.models import resolve_pretrained

    with pytest.raises(SnapevalError) as info:
        resolve_pretrained("assembled://damaged_weights_package")
    assert str(info.value) == (
        f"model.pretrained: cannot assemble damaged_weights_package's weights: {weights} is there but is "
        f"not them (truncated or damaged); delete it (rm {weights}) and run the command again, which "
        "assembles it anew"
    )
