"""Read the results database: ``python -m snapeval.results summary|export|migrate``.

``summary`` also lists the runs that are not finished: running, ``stale`` (its worker is gone: killed,
or its node lost), interrupted or failed and not finished since.

``migrate`` brings a database written by an older snapeval to today's configs (old keys renamed or
dropped by the legacy-key table, :mod:`snapeval.configs.legacy`; runs and samples re-keyed), so that its
runs resume without recomputation.

The database is ``--db`` (a path or SQLAlchemy URL), else ``$SNAPEVAL_DB``, else
``results/snapeval.sqlite`` in the current directory: the same precedence as ``run.db`` of
``python -m snapeval``. ``export --csv -`` writes the CSV to standard output; a reader that stops early
(``| head``) ends the command quietly, with the exit code of a process that SIGPIPE ended (141). The
database is only read (``migrate`` aside), and ``--csv`` is never it nor any other database.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from snapeval.cli import one_line_errors, stdout_closed
from snapeval.errors import SnapevalError
from snapeval.results import database_url, sqlite_path, summarize
from snapeval.results.files import safe_output, write_atomically
from snapeval.results.leases import needing_attention
from snapeval.results.options import add_db_option, open_existing
from snapeval.results.tables import render, summary_table

STDOUT = "-"  # --csv -: the CSV on standard output


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m snapeval.results", description="Read the snapeval results database."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="print accuracy, KV size and speed per experiment")
    export = commands.add_parser("export", help="write one row per sample to a CSV file")
    export.add_argument("--csv", required=True, type=Path, help="output file (-: standard output)")
    migrate = commands.add_parser("migrate", help="re-key runs stored by an older snapeval so they resume")
    for command in (summary, export, migrate):
        add_db_option(command)
    return parser


def _print_summary(df: pd.DataFrame, states: list[dict]) -> None:
    print(render(summary_table(summarize(df))) if not df.empty else "no samples stored yet")
    if attention := needing_attention(states):
        print(
            f"\n{len(attention)} run(s) not finished (stale: its worker is gone; the same command resumes):"
        )
        print(render(_runs_table(attention)))


def _runs_table(states: list[dict]) -> list[dict]:
    """Unfinished runs, one line each: what ran, where, since when, and how it stands."""
    columns = ["status", "model", "task", "method", "shard", "hostname", "pid", "created_at", "error"]
    return [
        {
            "run": state["id"],
            **{column: state.get(column) for column in columns},
            "created_at": f"{state['created_at']:%Y-%m-%d %H:%M}",
            "error": (state.get("error") or "")[:60],
        }
        for state in states
    ]


def _export(df: pd.DataFrame, path: Path, target: Path | None) -> None:
    """Write ``df`` as CSV, with lists and dicts (targets, extras) as JSON, to ``target`` (``path``
    resolved), or to standard output (the CSV alone) for None."""
    cells = df.map(lambda value: json.dumps(value) if isinstance(value, dict | list) else value)
    if target is None:
        cells.to_csv(sys.stdout, index=False)
        sys.stdout.flush()
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with write_atomically(target) as file:
            cells.to_csv(file, index=False)
    except OSError as exc:
        raise SnapevalError(f"cannot write {path}: {exc.strerror or exc}", "--csv") from None
    print(f"wrote {len(df)} samples to {path}")


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "migrate":
        with open_existing(args.db, write=True) as db:
            print(f"migrated {db.migrate()} run(s)")
        return 0
    target = None
    if args.command == "export" and str(args.csv) != STDOUT:
        target = safe_output(args.csv, {"--db": sqlite_path(database_url(args.db))}, "--csv")
    with open_existing(args.db) as db:
        df, states = db.dataframe(), db.run_states()
    try:
        if args.command == "summary":
            _print_summary(df, states)
        else:
            _export(df, args.csv, target)
    except BrokenPipeError:
        return stdout_closed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
