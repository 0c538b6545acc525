"""The command lines' shared helpers, in process: one ``error:`` line and exit code 2 for bad input, a
``--db`` that reading commands never create or change, and the one table formatter."""

from __future__ import annotations

import argparse
import math
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest
import yaml

from snapeval.cli import one_line_errors
from snapeval.commands.gate import main as gate_main
from snapeval.errors import SnapevalError
from snapeval.results import DEFAULT_DB, ResultsDB, load, summarize, summary_of
from snapeval.results.__main__ import main as results_main
from snapeval.results.options import add_db_option
from snapeval.results.tables import render, run_table, summary_table
from snapeval.run.runner import RunSummary
from snapeval.run.sweep import sweep_table

# --- one error line ---------------------------------------------------------------------------------


@one_line_errors
def toy(argv: list[str]) -> int:
    """A command with a ``--db`` and a ``--size`` that must be positive."""
    parser = argparse.ArgumentParser(prog="toy")
    add_db_option(parser)
    parser.add_argument("--size", type=int, default=1)
    args = parser.parse_args(argv)
    if args.size < 1:
        raise SnapevalError(f"must be a positive integer, got {args.size}\n(the rows per batch)", "--size")
    if args.size > 10:
        raise ValueError("a bug, not bad input")
    print(f"size {args.size}, db {args.db}")
    return 0


def test_bad_input_is_one_error_line_and_exit_code_2(capsys):
    assert toy(["--size", "0", "--db", "x.sqlite"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: --size: must be a positive integer, got 0 (the rows per batch)\n"
    assert toy(["--size", "3", "--db", "x.sqlite"]) == 0
    assert capsys.readouterr().out == "size 3, db x.sqlite\n"


def test_a_bug_keeps_its_traceback_and_argparse_its_usage(capsys):
    with pytest.raises(ValueError, match="a bug"):
        toy(["--size", "11"])
    with pytest.raises(SystemExit) as exited:
        toy(["--size", "many"])
    assert exited.value.code == 2 and "usage: toy [-h] [--db DB]" in capsys.readouterr().err


def test_the_database_option_says_its_default(capsys):
    with pytest.raises(SystemExit):
        toy(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"database path or SQLAlchemy URL (default: $SNAPEVAL_DB, else {DEFAULT_DB})" in help_text


def test_an_unsupported_database_is_named_by_the_option_given(tmp_path, capsys):
    assert results_main(["summary", "--db", "mysql://host/db"]) == 2
    expected = "error: --db: unsupported database 'mysql'; use a SQLite path or postgresql://\n"
    assert capsys.readouterr().err == expected


# --- reading commands never create or change a database ---------------------------------------------


def files(root: Path) -> dict[str, bytes | None]:
    """Everything under ``root``: each file's bytes, each folder as None."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in root.rglob("*")}


SPEC = [
    {
        "name": "passkey",
        "task": ["task=ruler_passkey", "task.context_length=512"],
        "cache": ["cache=snapstream", "cache.budget=256"],
        "min_retained": 0.8,
        "min_n": 1,
    }
]
COMMANDS = {
    "summary": ["summary"],
    "export": ["export", "--csv", "out/samples.csv"],
    "migrate": ["migrate"],
    "gate": ["--spec", "spec.yaml", "--no-run"],
}


@pytest.mark.parametrize("where", ["missing", "empty", "default"])
@pytest.mark.parametrize("command", COMMANDS)
def test_reading_commands_leave_the_filesystem_as_it_was(command, where, tmp_path, monkeypatch, capsys):
    """No database, an empty file, or no ``--db`` and no database at the default path: one line on
    ``--db``, exit code 2, and not a file or folder created or changed (``migrate`` included)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SNAPEVAL_DB", raising=False)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    path = {"missing": Path("sub/db.sqlite"), "empty": Path("empty.sqlite"), "default": DEFAULT_DB}[where]
    if where == "empty":
        path.write_bytes(b"")
    before = files(tmp_path)
    argv = COMMANDS[command] + ([] if where == "default" else ["--db", str(path)])
    code = (gate_main if command == "gate" else results_main)(argv)
    reason = "is not a SQLite database (left as it is)" if where == "empty" else "no results database at"
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --db: ") and reason in err and str(path) in err, err
    assert err.count("\n") == 1
    assert files(tmp_path) == before


def test_migrate_writes_a_database_that_holds_results(tmp_path, capsys):
    path = tmp_path / "db.sqlite"
    ResultsDB(path).close()
    assert results_main(["migrate", "--db", str(path)]) == 0
    assert capsys.readouterr().out == "migrated 0 run(s)\n"


# --- one table formatter ----------------------------------------------------------------------------


def parse(table: str) -> list[dict[str, str]]:
    """The rows of a rendered table, each a mapping from column name to the cell as shown."""
    header, _, *rows = table.splitlines()
    names = [name.strip() for name in header.strip("|").split("|")]
    return [dict(zip(names, (c.strip() for c in row.strip("|").split("|")), strict=True)) for row in rows]


CONFIG = {
    "model": {"name": "smollm2-135m"},
    "task": {"name": "ruler_passkey"},
    "cache": {"method": "snapkv", "budget": 256, "ratio": None, "window": 32},
}
# four answers, three right; 1.5 MiB of KV cache each; 8 tokens in 0.5 s; traces of 8 tokens, one truncated
SAMPLES = [
    {
        "sample_id": f"s{i}",
        "score": float(i < 3),
        "kv_bytes": 3 * 2**19,
        "prefill_s": 0.25,
        "decode_s": 0.5,
        "generated_tokens": 8,
        "extra": {"trace": {"generated_tokens": 8, "truncated": i == 0}},
    }
    for i in range(4)
]


@pytest.fixture
def stored(tmp_path) -> Path:
    """A database holding one finished run of :data:`CONFIG` with :data:`SAMPLES`."""
    path = tmp_path / "db.sqlite"
    with ResultsDB(path) as db:
        run_id = db.start_run(CONFIG, "h")
        for sample in SAMPLES:
            db.add_sample(run_id, "h", sample)
        db.finish_run(run_id)
    return path


def run_summary(config: dict, summary: dict, computed: int, elsewhere: int = 0) -> RunSummary:
    numbers = {key: summary[key] for key in ("n", "accuracy", "ci_low", "ci_high", "kv_mib", "prefill_s")}
    at_k = {key: value for key, value in summary.items() if key.startswith("pass@")}
    return RunSummary(
        0, "h", config, **numbers, decode_tok_s=summary["decode_tok_s"], computed=computed,
        elsewhere=elsewhere, pass_at=at_k,
    )  # fmt: skip


def test_run_table(capsys):
    full = {"model": {"name": "smollm2-135m"}, "task": {"name": "aime24"}, "cache": {"method": "full"}}
    sampled = {**CONFIG, "protocol": {"name": "deepseek_r1"}}
    summaries = [
        run_summary(full, summary_of(SAMPLES), computed=4),  # one draw per prompt: no pass@k
        run_summary(sampled, {**summary_of(SAMPLES[:1]), "pass@2": 0.875}, computed=0, elsewhere=3),
    ]
    assert run_table(summaries) == "\n".join(
        [
            "| model        | task                        | cache                         |   accuracy | 95% CI         |   pass@2 |   n |   new |   KV MiB |   prefill s |   decode tok/s |",  # noqa: E501
            "|--------------|-----------------------------|-------------------------------|------------|----------------|----------|-----|-------|----------|-------------|----------------|",  # noqa: E501
            "| smollm2-135m | aime24                      | full                          |      0.750 | [0.301, 0.954] |        - |   4 |     4 |      1.5 |        0.25 |           16.0 |",  # noqa: E501
            "| smollm2-135m | ruler_passkey (deepseek_r1) | snapkv(budget=256, window=32) |      1.000 | [0.207, 1.000] |    0.875 |   1 |     0 |      1.5 |        0.25 |           16.0 |",  # noqa: E501
            "3 sample(s) were claimed by other workers on the same point(s): see their output, or python -m "
            "snapeval.results summary once they finish",
        ]
    )


def test_summary_table_shows_missing_settings_and_drops_absent_traces():
    summaries = pd.DataFrame(
        [
            {"method": "full", "budget": math.nan, **summary_of(SAMPLES), "pass@2": math.nan},
            {"method": "snapkv", "budget": 256.0, **summary_of([]), "pass@2": 0.5},
        ]
    )
    assert render(summary_table(summaries)) == "\n".join(
        [
            "| method   |   budget |   accuracy | 95% CI         |   pass@2 |   n |   KV MiB |   prefill s |   decode tok/s |   trace tok |   truncated |",  # noqa: E501
            "|----------|----------|------------|----------------|----------|-----|----------|-------------|----------------|-------------|-------------|",  # noqa: E501
            "| full     |        - |      0.750 | [0.301, 0.954] |        - |   4 |      1.5 |        0.25 |           16.0 |           8 |         25% |",  # noqa: E501
            "| snapkv   |      256 |          - | -              |    0.500 |   0 |        - |           - |              - |           - |           - |",  # noqa: E501
        ]
    )
    untraced = summary_table(summaries.assign(trace_tokens=math.nan, truncated=math.nan))
    assert [list(row)[-2:] for row in untraced] == [["prefill s", "decode tok/s"]] * 2  # no trace columns


def test_the_three_tables_show_a_setting_alike(stored):
    """The run table, the sweep's table and the results summary: the same numbers, the same cells."""
    with ResultsDB(stored) as db:
        [sweep] = parse(render(sweep_table(db, datetime(2000, 1, 1, tzinfo=timezone.utc))))
    [run] = parse(run_table([run_summary(CONFIG, summary_of(SAMPLES), computed=4)]))
    [summary] = parse(render(summary_table(summarize(load(stored)))))
    assert sweep == {
        "task": "ruler_passkey",
        "cache": "snapkv(budget=256, window=32)",
        "accuracy": "0.750",
        "95% CI": "[0.301, 0.954]",
        "n": "4",
        "KV MiB": "1.5",
        "s/sample": "0.75",
        "trace tok": "8",
        "truncated": "25%",
        "status": "finished",
        "error": "",
    }
    numbers = {"accuracy", "95% CI", "n", "KV MiB"}
    assert run.keys() & summary.keys() == {"model", "task", *numbers, "prefill s", "decode tok/s"}
    assert sweep.keys() & summary.keys() == {"task", *numbers, "trace tok", "truncated"}
    for table in (run, sweep):
        assert {key: table[key] for key in table.keys() & summary.keys()} == {
            key: summary[key] for key in table.keys() & summary.keys()
        }
