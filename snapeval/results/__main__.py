"""Read the results database: ``python -m snapeval.results summary|export|migrate``.

``summary`` also lists the runs that are not finished: running, ``stale`` (its worker is gone: killed,
or its node lost), interrupted or failed and not finished since.

``migrate`` brings a database written by an older snapeval to today's configs (retired config keys
dropped, runs and samples re-keyed), so that its runs resume.

The database is ``--db`` (a path or SQLAlchemy URL), else ``$SNAPEVAL_DB``, else
``results/snapeval.sqlite`` in the current directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from snapeval.errors import SnapevalError
from snapeval.results import DB_ENV_VAR, DEFAULT_DB, ResultsDB, summarize
from snapeval.results.leases import needing_attention


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m snapeval.results", description="Read the snapeval results database."
    )
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument(
        "--db", help=f"database path or SQLAlchemy URL (default: ${DB_ENV_VAR}, else {DEFAULT_DB})"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("summary", parents=[db], help="print accuracy, KV size and speed per experiment")
    export = commands.add_parser("export", parents=[db], help="write one row per sample to a CSV file")
    export.add_argument("--csv", required=True, type=Path, help="output file")
    commands.add_parser(
        "migrate", parents=[db], help="re-key runs stored by an older snapeval so they resume"
    )
    return parser


def _print_summary(df: pd.DataFrame, states: list[dict]) -> None:
    if df.empty:
        print("no samples stored yet")
    else:
        table = display_table(summarize(df))
        print(tabulate(table, headers="keys", tablefmt="github", showindex=False, disable_numparse=True))
    if attention := needing_attention(states):
        print(
            f"\n{len(attention)} run(s) not finished (stale: its worker is gone; the same command resumes):"
        )
        print(tabulate(_runs_table(attention), headers="keys", tablefmt="github", showindex=False))


def _runs_table(states: list[dict]) -> pd.DataFrame:
    """Unfinished runs, one line each: what ran, where, since when, and how it stands."""
    columns = ["id", "status", "model", "task", "method", "shard", "hostname", "pid", "created_at", "error"]
    table = pd.DataFrame.from_records(states, columns=columns).rename(columns={"id": "run"})
    table["created_at"] = table["created_at"].map(lambda when: f"{when:%Y-%m-%d %H:%M}")
    table["error"] = table["error"].fillna("").str.slice(0, 60)
    return table.fillna("-")


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The summary under the run table's column names (``95% CI``, ``KV MiB``, ...); a setting a method
    does not have (the full cache's budget) shows as ``-``; trace columns only where traces exist."""
    untraced = [column for column in ("trace_tokens", "truncated") if table[column].isna().all()]
    table = table.drop(columns=untraced)  # runs stored before traces were recorded
    shown = table.drop(columns=["ci_low", "ci_high"]).astype(object).where(table.notna(), "-")
    shown["accuracy"] = table["accuracy"].map("{:.3f}".format)
    shown.insert(
        list(shown.columns).index("accuracy") + 1,
        "95% CI",
        [f"[{low:.3f}, {high:.3f}]" for low, high in zip(table["ci_low"], table["ci_high"], strict=True)],
    )
    names = {"kv_mib": "KV MiB", "prefill_s": "prefill s", "decode_tok_s": "decode tok/s"}
    names |= {"trace_tokens": "trace tok"}
    for column in ("kv_mib", "prefill_s", "decode_tok_s", "trace_tokens", "truncated"):
        if column in table:
            shown[column] = table[column].map(lambda v: "-" if pd.isna(v) else f"{v:.3g}")
    return shown.rename(columns=names)


def _export(df: pd.DataFrame, path: Path) -> None:
    """Write ``df`` as CSV, with lists and dicts (targets, extras) as JSON."""
    if path.is_dir():
        raise SnapevalError(f"{path} is a directory; give a file name (say {path / 'samples.csv'})", "--csv")
    cells = df.map(lambda value: json.dumps(value) if isinstance(value, dict | list) else value)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cells.to_csv(path, index=False)
    except OSError as exc:
        raise SnapevalError(f"cannot write {path}: {exc.strerror or exc}", "--csv") from None
    print(f"wrote {len(df)} samples to {path}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "migrate":
            with ResultsDB(args.db, must_exist=True, field="--db") as db:
                print(f"migrated {db.migrate()} run(s)")
            return 0
        with ResultsDB(args.db, must_exist=True, writable=False, field="--db") as db:
            df, states = db.dataframe(), db.run_states()
        if args.command == "summary":
            _print_summary(df, states)
        else:
            _export(df, args.csv)
    except SnapevalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
