"""No command writes over the files SQLite keeps beside a database (``D-wal``, ``D-shm``, ``D-journal``):
its write-ahead log holds committed transactions the database file does not have yet.

A database in WAL mode holds 12 samples; another connection deleted 3 of them in a transaction it
committed and did not checkpoint (the connection stays open, so its log stays). Every output of the
report, the export and the figures, and the database a gate or a run writes, is refused in one line
naming its field when it is such a file, of ``--db`` (as a path or a ``sqlite:///`` URL) or of any
other SQLite database; the database still holds 9 samples and its files are unchanged.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapeval.__main__ import check_before_hydra
from snapeval.commands.gate import main as gate_main
from snapeval.errors import SnapevalError
from snapeval.figures.command import main as figures_main
from snapeval.report.__main__ import main as report_main
from snapeval.results import ResultsDB
from snapeval.results.__main__ import main as results_main

SAMPLES, DELETED = 12, 3


def count(path: Path) -> int:
    """The samples a fresh connection reads in ``path`` (the write-ahead log's transactions included)."""
    with sqlite3.connect(path) as conn:
        (n,) = conn.execute("SELECT count(*) FROM samples").fetchone()
    conn.close()
    return n


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Path]:
    """``db.sqlite`` in WAL mode whose log holds a committed, not checkpointed, deletion of 3 samples."""
    path = tmp_path / "db.sqlite"
    with ResultsDB(path) as db:
        for method, budget in (("full", None), ("snapkv", 64)):
            config = {
                "model": {"name": "m"},
                "task": {"name": "t"},
                "cache": {"method": method, "budget": budget},
            }
            run_id = db.start_run(config, method)
            for sample in range(SAMPLES // 2):
                db.add_sample(run_id, method, {"sample_id": str(sample), "output": "o", "score": 1.0})
            db.finish_run(run_id)
    holder = sqlite3.connect(path)
    assert holder.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    holder.execute("PRAGMA wal_autocheckpoint = 0")
    holder.execute("DELETE FROM samples WHERE id IN (SELECT id FROM samples LIMIT ?)", (DELETED,))
    holder.commit()
    assert Path(f"{path}-wal").stat().st_size > 0 and count(path) == SAMPLES - DELETED
    yield path
    holder.close()


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    return err.removesuffix("\n")


def damage(path: Path, suffix: str, database: Path) -> str:
    """The refusal of ``path``, the ``suffix`` file of ``--db`` (``database``)."""
    return (
        f"{path} is the {suffix} file of --db ({database}): writing it would damage that database; "
        "give another file"
    )


COMMANDS = {
    "report": ("--out", lambda db, out: report_main(["--db", db, "--out", str(out)])),
    "export": ("--csv", lambda db, out: results_main(["export", "--db", db, "--csv", str(out)])),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
@pytest.mark.parametrize("given", ["path", "url"])
def test_an_output_over_the_databases_own_files_is_refused(command, suffix, given, database, capsys):
    field, run = COMMANDS[command]
    before = files_of(database.parent)
    out = Path(f"{database}{suffix}")
    assert run(str(database) if given == "path" else f"sqlite:///{database}", out) == 2
    assert one_line(capsys) == f"error: {field}: {damage(out, suffix, database)}"
    assert files_of(database.parent) == before and count(database) == SAMPLES - DELETED


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_over_another_databases_log_is_refused(command, database, tmp_path, capsys):
    field, run = COMMANDS[command]
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).close()
    other.write_bytes(database.read_bytes())  # a SQLite file, not the command's input
    out = tmp_path / "other.sqlite-wal"
    assert run(str(database), out) == 2
    message = f"{out} is the -wal file of the SQLite database {other}: writing it would damage that database"
    assert one_line(capsys) == f"error: {field}: {message}; give another file"
    assert not out.exists()


def test_a_figure_linked_to_the_log_is_refused(database, tmp_path, capsys):
    figures = tmp_path / "figures"
    figures.mkdir()
    png = figures / "accuracy_vs_budget.png"
    png.symlink_to(Path(f"{database}-wal"))
    before = files_of(database.parent)
    assert figures_main(["--db", str(database), "--out", str(figures)]) == 2
    assert one_line(capsys) == f"error: --out: {damage(png, '-wal', database)}"
    assert files_of(database.parent) == before and count(database) == SAMPLES - DELETED


@pytest.mark.parametrize("suffix", ["-wal", "-journal"])
def test_a_database_to_write_that_is_anothers_log_is_refused(suffix, database, tmp_path, capsys):
    """The gate, a run and a search write their database: never over another one's files."""
    target = Path(f"{database}{suffix}")
    reason = f"{target} is the {suffix} file of the SQLite database {database}: writing it would damage"
    with pytest.raises(SnapevalError, match=f"^run.db: {reason}"):
        check_before_hydra([f"run.db={target}"])
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "- {name: g, task: [task=ruler_passkey], cache: [cache=snapkv], min_retained: 0.5, min_n: 1}\n"
    )
    before = files_of(database.parent)
    assert gate_main(["--spec", str(spec), "--db", str(target)]) == 2
    assert one_line(capsys).startswith(f"error: --db: {reason} that database; give another file")
    assert files_of(database.parent) == before and count(database) == SAMPLES - DELETED


def test_a_gate_whose_database_is_its_spec_is_refused_unchanged(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "- {name: g, task: [task=ruler_passkey], cache: [cache=snapkv], min_retained: 0.5, min_n: 1}\n"
    )
    before = files_of(tmp_path)
    assert gate_main(["--spec", str(spec), "--db", str(spec)]) == 2
    assert one_line(capsys).startswith("error: --db: ")
    assert files_of(tmp_path) == before
