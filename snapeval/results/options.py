"""The command-line options every command that reads the results database shares: ``--db``, and the
database it names opened as it must exist."""

from __future__ import annotations

import argparse

from snapeval.results.connect import DB_ENV_VAR, DEFAULT_DB
from snapeval.results.store import ResultsDB

DB_OPTION = "--db"


def add_db_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--db``: the results database (``args.db``; None is ``$SNAPEVAL_DB`` or the default)."""
    parser.add_argument(
        DB_OPTION, help=f"database path or SQLAlchemy URL (default: ${DB_ENV_VAR}, else {DEFAULT_DB})"
    )


def open_existing(url: str | None, *, write: bool = False, field: str = DB_OPTION) -> ResultsDB:
    """The snapeval database at ``url`` (see :func:`snapeval.results.database_url`), which must exist and
    hold snapeval results; read-only unless ``write`` (``migrate``). A missing database is not created, a
    file that is not one (empty, or another program's) is left as it is: a :class:`SnapevalError` on
    ``field`` says so."""
    reader = ResultsDB(url, must_exist=True, writable=False, field=field)
    if not write:
        return reader
    reader.close()
    return ResultsDB(url, must_exist=True, field=field)
