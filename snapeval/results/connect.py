"""Opening the results database: the URL a user gives, the engine, its schema, and one clear line
(naming ``run.db``) for every way opening can fail.

SQLite runs in WAL mode with a busy timeout, so that several local workers (a Hydra multirun with the
joblib launcher) write to one file at once. ``postgresql://`` URLs use psycopg 3, shipped with
``pip install "snapeval[cluster]"``.

Which database: the one named on the command line (``run.db=...``, ``--db``), else ``$SNAPEVAL_DB``, else
``results/snapeval.sqlite``, for every command alike. A database is written only when it is snapeval's
(:func:`check_ours`: no tables yet, or snapeval's tables with their columns): another program's database
is refused and left as it is, and so is an in-memory one, whose results would be lost. A reading command
(``writable=False``) never writes: SQLite is opened read-only (``mode=ro``; ``immutable`` on storage it
cannot write), PostgreSQL in read-only transactions, and no table is created or changed, so the tables
an older snapeval lacks read as empty (:func:`snapeval.results.schema.stored_tables`).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from contextlib import suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, delete, event, false, inspect, make_url, text, update
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.schema import CreateIndex, CreateTable

from snapeval.configs import root
from snapeval.errors import SnapevalError
from snapeval.results.files import is_sqlite, sidecar_message, sidecar_of
from snapeval.results.schema import (
    memory_estimates,
    metadata,
    required_columns,
    runs,
    samples,
    stored_before,
)

DEFAULT_DB = Path(root.DEFAULT_DB)  # run.db's default without $SNAPEVAL_DB
DB_ENV_VAR = root.DB_ENV_VAR
BUSY_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 10
SUPPORTED_DIALECTS = ("sqlite", "postgresql")
FIELD = "run.db"
SCHEMA_LOCK = 0x5EA1  # the PostgreSQL advisory lock under which workers create or upgrade the schema


def database_url(url_or_path: str | os.PathLike[str] | None = None) -> str:
    """A SQLAlchemy URL as is (``postgresql://`` with the psycopg 3 driver); a plain path as SQLite there;
    None (nothing on the command line) as ``$SNAPEVAL_DB``, else the default."""
    if url_or_path is None:
        url_or_path = os.environ.get(DB_ENV_VAR, DEFAULT_DB)
    url = os.fspath(url_or_path)
    if "://" not in url:
        return f"sqlite:///{url}"
    scheme, rest = url.split("://", 1)
    return f"postgresql+psycopg://{rest}" if scheme in ("postgresql", "postgres") else url


def sqlite_path(url: str) -> Path | None:
    """The file of a file-backed SQLite URL, else None (a server, in memory, or not a URL at all)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database.removeprefix("file:"))


def open_engine(url: str, *, must_exist: bool = False, writable: bool = True, field: str = FIELD) -> Engine:
    """An engine on ``url``: if ``writable``, with the schema created (or brought up to date) and proven
    writable, else one that only reads; any failure to open, read or write it is a
    :class:`SnapevalError` on ``field`` in one line."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise SnapevalError(f"not a database URL or path: {url!r}", field) from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED_DIALECTS:
        raise SnapevalError(f"unsupported database {backend!r}; use a SQLite path or postgresql://", field)
    if backend == "sqlite" and _in_memory(parsed):
        raise SnapevalError(_in_memory_message(url), field)
    path = sqlite_path(url)
    try:
        if path is not None:
            _check_file(path, must_exist, writable, field)
    except OSError as exc:  # a name too long, a parent that is a file, no permission
        raise SnapevalError(f"cannot use {_short(path)}: {exc.strerror or exc}", field) from None
    try:
        # nothing changes (not even WAL) before the check; a reading command's engine never writes
        reader = _engine(url, backend, writable=False) if writable else _read_only(url, backend, path)
        try:
            check_ours(reader, _short(path or _shown(parsed)), writable, field)
        except BaseException:
            reader.dispose()
            raise
        if not writable:
            return reader
        reader.dispose()
        engine = _engine(url, backend)
        create_schema(engine)
        with engine.begin() as conn:  # a write that changes nothing: refused by a read-only database
            conn.execute(delete(memory_estimates).where(false()))
    except ModuleNotFoundError as exc:
        raise SnapevalError(
            f'the {exc.name} driver is not installed: pip install "snapeval[cluster]"', field
        ) from None
    except NoSuchModuleError as exc:
        raise SnapevalError(f"unknown database driver ({exc})", field) from None
    except DBAPIError as exc:
        raise SnapevalError(f"cannot use {path or _shown(parsed)}: {_reason(exc)}", field) from None
    return engine


def check_ours(engine: Engine, where: str, writable: bool = True, field: str = FIELD) -> None:
    """Refuse, before anything in it changes, a database that is not snapeval's: one with a table of
    snapeval's name that lacks the columns snapeval cannot add (:func:`required_columns`), or with other
    tables and not snapeval's runs and samples. A database with no tables yet is snapeval's to write (not
    to read), and so is one with only some of snapeval's tables (being created by another worker)."""
    inspector = inspect(engine)
    tables = sorted(name for name in inspector.get_table_names() if not name.startswith("sqlite_"))
    ours = {table.name: table for table in metadata.sorted_tables}
    for name in (name for name in tables if name in ours):
        have = {column["name"] for column in inspector.get_columns(name)}
        if missing := [column for column in required_columns(ours[name]) if column not in have]:
            raise SnapevalError(
                f"{where} is not a snapeval database: its {name} table lacks snapeval's columns "
                f"{', '.join(missing)} (left as it is; give a new file)",
                field,
            )
    others = [name for name in tables if name not in ours]
    if others and not {runs.name, samples.name} <= set(tables):
        raise SnapevalError(
            f"{where} holds no snapeval results but another program's tables ({_listed(others)}); "
            "left as it is: give a new file or a snapeval database",
            field,
        )
    if not writable and runs.name not in tables:  # reading never creates tables
        raise SnapevalError(f"{where} holds no snapeval results", field)


def _listed(names: list[str], shown: int = 5) -> str:
    """The first ``shown`` names, and how many more."""
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(name[:60] for name in names[:shown]) + more


def _in_memory(parsed: Any) -> bool:
    """An in-memory SQLite database: no file name, ``:memory:``, or a ``mode=memory`` URI."""
    database = (parsed.database or "").removeprefix("file:")
    return database in ("", ":memory:") or parsed.query.get("mode") == "memory"


def _in_memory_message(url: str) -> str:
    """Why an in-memory database is refused, naming ``$SNAPEVAL_DB`` when the value came from it."""
    env = os.environ.get(DB_ENV_VAR)
    source = f" (from ${DB_ENV_VAR})" if env is not None and database_url(env) == url else ""
    return (
        f"{_short(url)}{source} is an in-memory SQLite database (so are an empty value and :memory:): "
        "every result would be lost when the command ends; give a file path or a server URL"
    )


def _check_file(path: Path, must_exist: bool, writable: bool, field: str) -> None:
    """A SQLite file that can be opened: not a folder, nor a file SQLite keeps beside another database
    (its ``-wal``, ``-shm`` or ``-journal``); one that exists if ``must_exist``; an existing SQLite
    database (never one created or turned into one) unless ``writable``."""
    if path.is_dir():
        raise SnapevalError(f"{_short(path)} is a directory, not a database file", field)
    if sidecar := sidecar_of(path):
        raise SnapevalError(sidecar_message(Path(_short(path)), *sidecar), field)
    if must_exist and not path.is_file():
        raise SnapevalError(f"no results database at {_short(path)}; run python -m snapeval first", field)
    if not writable and path.is_file() and not is_sqlite(path):
        raise SnapevalError(f"{_short(path)} is not a SQLite database (left as it is)", field)
    if writable:
        path.parent.mkdir(parents=True, exist_ok=True)


def _short(path: Path | str, keep: int = 120) -> str:
    """A path as a message shows it: its start and end when it is very long."""
    text = str(path)
    return (
        text if len(text) <= keep else f"{text[: keep // 2]}...{text[-keep // 2 :]} ({len(text)} characters)"
    )


def _engine(url: str, backend: str, writable: bool = True) -> Engine:
    if backend == "postgresql":
        return create_engine(url, connect_args={"connect_timeout": CONNECT_TIMEOUT_S}, pool_pre_ping=True)
    engine = create_engine(url)
    event.listen(engine, "connect", _configure_sqlite if writable else _configure_sqlite_reader)
    return engine


def _read_only(url: str, backend: str, path: Path | None) -> Engine:
    """An engine that cannot write: PostgreSQL's transactions read-only; SQLite's file opened ``mode=ro``,
    or ``immutable`` where its folder cannot be written (read-only storage: no writer there either, and
    a WAL database opens no other way) unless a WAL file beside it holds what the file does not."""
    if path is None:  # PostgreSQL (an in-memory SQLite database was refused)
        return create_engine(
            url,
            connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
            pool_pre_ping=True,
            execution_options={"postgresql_readonly": True},
        )
    unwritable = not os.access(path.parent, os.W_OK) and not Path(f"{path}-wal").exists()
    uri = f"file:{quote(str(path.absolute()))}?mode=ro" + ("&immutable=1" if unwritable else "")
    engine = create_engine(url, creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False))
    event.listen(engine, "connect", _configure_sqlite_reader)
    return engine


def _configure_sqlite_reader(dbapi_connection: Any, _record: Any) -> None:
    """A reading connection: waits on locks, and changes nothing (the journal mode is the writers')."""
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cursor.close()


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")  # before WAL, which may wait on a lock
    with suppress(sqlite3.OperationalError):  # a read-only database: readable, refused by open_engine's write
        cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def create_schema(engine: Engine) -> None:
    """Create the tables that are missing and add the columns that a database written by an older
    snapeval lacks (nullable columns only: old rows keep their values, or take the values the older
    snapeval stored of them elsewhere, :func:`~snapeval.results.schema.stored_before`, in the
    transaction that adds them)."""
    with engine.begin() as conn:
        # several workers may open a new database at once: PostgreSQL's concurrent CREATE TABLE IF NOT
        # EXISTS can still collide, so they take turns; SQLite runs each statement under its write lock
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"))
        existing = inspect(conn)
        for table in metadata.sorted_tables:
            if existing.has_table(table.name):
                have = {column["name"] for column in existing.get_columns(table.name)}
                derived = stored_before(table, have, tensor_parallel=True)  # runs came first: it has it
                added = set()
                for column in table.columns:
                    if column.name not in have:
                        kind = column.type.compile(dialect=engine.dialect)
                        add = f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}"
                        try:
                            conn.execute(text(add))
                            added.add(column.name)
                        except DBAPIError as exc:  # SQLite: another worker added it a moment ago
                            if "duplicate column" not in str(exc.orig):
                                raise
                if derived and set(derived) - have <= added:  # else the worker that added them did it
                    conn.execute(update(table).values(derived))
                continue
            conn.execute(CreateTable(table, if_not_exists=True))
            for index in table.indexes:
                conn.execute(CreateIndex(index, if_not_exists=True))


def _shown(parsed: Any) -> str:
    """The database's URL without its password."""
    return parsed.render_as_string(hide_password=True)


def _reason(exc: DBAPIError) -> str:
    """The driver's own message, first line, without SQLAlchemy's background link."""
    lines = str(exc.orig).strip().splitlines() or [type(exc.orig).__name__]
    reason = lines[0]
    if "readonly" in reason or "read-only" in reason:
        return f"{reason} (results are written as the run goes: give a writable database)"
    if "file is not a database" in reason:
        return f"{reason} (the file is not a SQLite database, or it is corrupt)"
    return reason


def write_error(exc: DBAPIError, url: str, field: str = FIELD) -> SnapevalError:
    """A write to the open database at ``url`` that failed (its disk full, say), in one line on ``field``:
    the driver's reason and, for a SQLite file, the space left on its disk."""
    path = sqlite_path(url)
    where = _short(path) if path is not None else _shown(make_url(url))
    space = ""
    if path is not None:
        with suppress(OSError):
            usage = shutil.disk_usage(path.absolute().parent)
            space = f" ({usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB on its disk)"
    return SnapevalError(
        f"cannot write to {where}: {_reason(exc)}{space}; the samples stored so far are kept, and the same "
        "command resumes the run",
        field,
    )
