"""A database that a command created and then refused to use: removed, so that a refusal leaves no file.

A run opens its database early (a bad ``run.db`` is refused in a second, before torch loads), which
creates a new SQLite file; a later refusal of the same command (a model the ranks cannot split, say)
then removes it, with its sidecar files, unless a run was recorded in it meanwhile (another worker's).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing, suppress
from pathlib import Path

from snapeval.results.connect import database_url, sqlite_path
from snapeval.results.files import SIDECARS


def new_sqlite_file(url_or_path: str) -> Path | None:
    """The SQLite file that opening ``url_or_path`` would create: None where it exists or is no file."""
    path = sqlite_path(database_url(url_or_path))
    try:
        return path if path is not None and not path.exists() else None
    except OSError:  # a name too long, say: opening it is refused in its own words
        return None


def remove_unused(path: Path | None) -> None:
    """Remove the SQLite database at ``path`` and its sidecar files if no run was recorded in it."""
    if path is None or not path.is_file():
        return
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
            tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master")}
            if "runs" in tables and connection.execute("SELECT count(*) FROM runs").fetchone()[0]:
                return
    except sqlite3.Error:
        return
    for name in (path.name, *(path.name + suffix for suffix in SIDECARS)):
        with suppress(FileNotFoundError):
            (path.parent / name).unlink()
