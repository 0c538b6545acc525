"""Writes and reads of the results database: runs and samples committed one at a time (an interrupted
run resumes from what it stored), memory estimates, and the whole database as a DataFrame."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import Engine, create_engine, delete, event, make_url, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from snapeval.errors import SnapevalError
from snapeval.results.identity import (
    ALIASES,
    config_hash,
    flatten,
    git_sha,
    package_versions,
    without_retired_keys,
)
from snapeval.results.schema import RunStatus, memory_estimates, metadata, runs, samples

DEFAULT_DB = Path("results/snapeval.sqlite")
DB_ENV_VAR = "SNAPEVAL_DB"
BUSY_TIMEOUT_MS = 30_000

#: The supported databases, with their INSERT that can skip or replace a row already stored.
_INSERT_ON_CONFLICT = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def database_url(url_or_path: str | os.PathLike[str] | None = None) -> str:
    """A SQLAlchemy URL as is; a plain path as SQLite there; None as ``$SNAPEVAL_DB`` or the default."""
    if url_or_path is None:
        url_or_path = os.environ.get(DB_ENV_VAR, DEFAULT_DB)
    text = os.fspath(url_or_path)
    return text if "://" in text else f"sqlite:///{text}"


def sqlite_path(url: str) -> Path | None:
    """The file of a file-backed SQLite URL, else None."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")  # before WAL, which may wait on a lock
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


class ResultsDB:
    """Runs and their samples. Each write commits at once, so a killed run keeps what it stored."""

    def __init__(self, url: str | os.PathLike[str] | None = None, *, must_exist: bool = False):
        """Open (and create, unless ``must_exist``) the database at ``url``; see :func:`database_url`."""
        self.url = database_url(url)
        path = sqlite_path(self.url)
        if path is not None:
            if must_exist and not path.is_file():
                raise SnapevalError(f"no results database at {path}; run python -m snapeval first")
            path.parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(self.url)
        if self.engine.dialect.name not in _INSERT_ON_CONFLICT:
            raise SnapevalError(
                f"unsupported database {self.engine.dialect.name!r}; use SQLite or PostgreSQL"
            )
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _configure_sqlite)
        self._create_schema()

    def _create_schema(self) -> None:
        # IF NOT EXISTS: several processes may open a new database at the same moment.
        with self.engine.begin() as conn:
            for table in metadata.sorted_tables:
                conn.execute(CreateTable(table, if_not_exists=True))
                for index in table.indexes:
                    conn.execute(CreateIndex(index, if_not_exists=True))

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start_run(self, config: Mapping[str, Any], config_hash: str) -> int:
        """Record a new running run of ``config`` with its provenance; return its id."""
        flat = flatten(config)
        values = {
            "created_at": _utcnow(),
            "status": "running",
            "git_sha": git_sha(),
            "versions": package_versions(),
            "hostname": socket.gethostname(),
            "config": dict(config),
            "config_hash": config_hash,
            "model": flat.get(ALIASES["model"]),
            "task": flat.get(ALIASES["task"]),
            "method": flat.get(ALIASES["method"]),
        }
        with self.engine.begin() as conn:
            return conn.execute(runs.insert().values(values)).inserted_primary_key[0]

    def finish_run(self, run_id: int, status: RunStatus = "finished", error: str | None = None) -> None:
        """Close a run with its final status (and error message, if it failed)."""
        values = {"status": status, "error": error, "finished_at": _utcnow()}
        with self.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id == run_id).values(values))

    def add_sample(self, run_id: int, config_hash: str, row: Mapping[str, Any]) -> bool:
        """Store one scored sample (keys: the ``samples`` columns); False if it was already stored.

        A sample is stored once per config: a second write of the same ``sample_id`` is ignored.
        """
        values = {
            **row,
            "sample_id": str(row["sample_id"]),
            "run_id": run_id,
            "config_hash": config_hash,
            "created_at": _utcnow(),
        }
        insert = _INSERT_ON_CONFLICT[self.engine.dialect.name](samples).values(values)
        with self.engine.begin() as conn:
            result = conn.execute(insert.on_conflict_do_nothing(index_elements=["config_hash", "sample_id"]))
        return result.rowcount == 1

    def migrate(self) -> int:
        """Drop retired keys from every stored config and re-key its run and samples by the new hash
        (a sample already stored under the new hash wins); returns how many runs changed."""
        changed = 0
        with self.engine.begin() as conn:
            for run in conn.execute(select(runs.c.id, runs.c.config, runs.c.config_hash)).mappings().all():
                config = dict(without_retired_keys(run["config"]))
                digest = config_hash(config)
                if digest == run["config_hash"] and config == run["config"]:
                    continue
                stored = select(samples.c.sample_id).where(samples.c.config_hash == digest)
                ours = (samples.c.config_hash == run["config_hash"]) & (samples.c.run_id == run["id"])
                conn.execute(delete(samples).where(ours & samples.c.sample_id.in_(stored)))
                conn.execute(update(samples).where(ours).values(config_hash=digest))
                this_run = runs.c.id == run["id"]
                conn.execute(update(runs).where(this_run).values(config=config, config_hash=digest))
                changed += 1
        return changed

    def done_sample_ids(self, config_hash: str) -> set[str]:
        """Ids of the samples already stored for this config, by any run."""
        query = select(samples.c.sample_id).where(samples.c.config_hash == config_hash)
        with self.engine.connect() as conn:
            return set(conn.execute(query).scalars())

    def runs_since(self, since: datetime) -> list[dict[str, Any]]:
        """Runs created at or after ``since`` (UTC), oldest first: the points of a sweep."""
        query = select(runs).where(runs.c.created_at >= since.replace(tzinfo=None)).order_by(runs.c.id)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def samples_for(self, config_hash: str) -> list[dict[str, Any]]:
        """The stored samples of this config, in the order they were stored."""
        query = select(samples).where(samples.c.config_hash == config_hash).order_by(samples.c.id)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def dataframe(self) -> pd.DataFrame:
        """One row per sample: its run's flattened config and provenance, then the sample's columns."""
        run_query = select(runs.c.id, runs.c.git_sha, runs.c.status, runs.c.created_at, runs.c.config)
        with self.engine.connect() as conn:
            run_columns = {run.id: _run_columns(run) for run in conn.execute(run_query).mappings()}
            sample_rows = conn.execute(select(samples).order_by(samples.c.id)).mappings().all()
        return pd.DataFrame.from_records(
            [{**run_columns[sample["run_id"]], **_sample_columns(sample)} for sample in sample_rows]
        )

    def add_memory_estimate(self, config: Mapping[str, Any], row: Mapping[str, Any]) -> None:
        """Store the estimate ``row`` of the memory ``config``, replacing any stored for the same config."""
        values = {
            "config_hash": config_hash(config, ignore=()),
            "config": dict(config),
            "estimate": dict(row),
            "estimated_at": _utcnow(),
        }
        insert = _INSERT_ON_CONFLICT[self.engine.dialect.name](memory_estimates).values(values)
        replace = {key: insert.excluded[key] for key in ("config", "estimate", "estimated_at")}
        with self.engine.begin() as conn:
            conn.execute(insert.on_conflict_do_update(index_elements=["config_hash"], set_=replace))

    def memory_dataframe(self) -> pd.DataFrame:
        """One row per memory estimate: the estimate's columns, its config hash and when it was made."""
        query = select(memory_estimates).order_by(memory_estimates.c.id)
        with self.engine.connect() as conn:
            stored = conn.execute(query).mappings().all()
        return pd.DataFrame.from_records(
            [
                {**row["estimate"], "config_hash": row["config_hash"], "estimated_at": row["estimated_at"]}
                for row in stored
            ]
        )


def _run_columns(run: Mapping[str, Any]) -> dict[str, Any]:
    flat = flatten(run["config"])
    aliases = {alias: flat[path] for alias, path in ALIASES.items() if path in flat}
    provenance = {key: run[key] for key in ("git_sha", "status", "created_at")}
    return {**flat, **aliases, "run_id": run["id"], **provenance}


def _sample_columns(sample: Mapping[str, Any]) -> dict[str, Any]:
    columns = {key: value for key, value in sample.items() if key not in ("id", "created_at", "metrics")}
    metrics = sample["metrics"] or {}
    return {**columns, **{f"metric.{name}": value for name, value in metrics.items()}}


def load(url_or_path: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """All samples of an existing database as a DataFrame; see :meth:`ResultsDB.dataframe`."""
    with ResultsDB(url_or_path, must_exist=True) as db:
        return db.dataframe()


def load_memory(url_or_path: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """All memory estimates of an existing database as a DataFrame; see :meth:`ResultsDB.memory_dataframe`."""
    with ResultsDB(url_or_path, must_exist=True) as db:
        return db.memory_dataframe()
