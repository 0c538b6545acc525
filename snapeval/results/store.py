"""Writes and reads of the results database: runs and samples committed one at a time (an interrupted
run resumes from what it stored), memory estimates, and the whole database as a DataFrame."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from snapeval.protocols import flatten
from snapeval.results.connect import database_url, open_engine
from snapeval.results.identity import ALIASES, config_hash, git_sha, package_versions, run_config, upgraded
from snapeval.results.leases import (
    DEFAULT_LEASE_S,
    STALE_ERROR,
    Clock,
    expiry,
    run_state,
    utcnow,
    worker_gone,
)
from snapeval.results.schema import (
    RunStatus,
    claims,
    decisions,
    memory_estimates,
    metadata,
    runs,
    samples,
    stored_tables,
)

if TYPE_CHECKING:  # pandas loads with the first DataFrame: opening a database (or refusing one) is faster
    import pandas as pd

#: The supported databases, with their INSERT that can skip or replace a row already stored.
_INSERT_ON_CONFLICT = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


class ResultsDB:
    """Runs and their samples. Each write commits at once, so a killed run keeps what it stored."""

    def __init__(
        self,
        url: str | os.PathLike[str] | None = None,
        *,
        must_exist: bool = False,
        writable: bool = True,
        field: str = "run.db",
        clock: Clock = utcnow,
    ):
        """Open (and create, unless ``must_exist``) the database at ``url`` (see :func:`database_url`),
        proven writable, or only read when ``writable`` is false (its tables as stored: an older
        snapeval's read as today's); a failure is a :class:`SnapevalError` on ``field``. ``clock`` is the
        time that runs, samples and leases are stamped and expired with."""
        self.url, self.clock, self.field = database_url(url), clock, field
        self.engine: Engine = open_engine(self.url, must_exist=must_exist, writable=writable, field=field)
        self.tables = (
            {table.name: table for table in metadata.sorted_tables}
            if writable
            else stored_tables(self.engine)
        )

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start_run(self, config: Mapping[str, Any], config_hash: str, lease_s: float = DEFAULT_LEASE_S) -> int:
        """Record a new running run of ``config`` with its provenance (alive for ``lease_s`` unless
        renewed, see :class:`~snapeval.results.leases.Lease`); return its id."""
        flat, now = flatten(config), self.clock()
        values = {
            "created_at": now,
            "status": "running",
            "git_sha": git_sha(),
            "versions": package_versions(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "expires_at": expiry(lease_s, now),
            "config": dict(config),
            "config_hash": config_hash,
            "model": flat.get(ALIASES["model"]),
            "task": flat.get(ALIASES["task"]),
            "method": flat.get(ALIASES["method"]),
        }
        with self.engine.begin() as conn:
            run_id = conn.execute(runs.insert().values(values)).inserted_primary_key[0]
        self._close_stale(config_hash, run_id)
        return run_id

    def _close_stale(self, config_hash: str, run_id: int) -> None:
        """Mark the runs of ``config_hash`` still ``running`` whose worker is gone (killed, its node lost)
        as failed, naming why, so that the runs table no longer shows them running."""
        query = select(runs).where(
            (runs.c.config_hash == config_hash) & (runs.c.status == "running") & (runs.c.id != run_id)
        )
        now = self.clock()
        with self.engine.connect() as conn:
            dead = [run for run in conn.execute(query).mappings() if run_state(run, now) == "stale"]
        with self.engine.begin() as conn:
            for run in dead:
                error = (
                    f"{STALE_ERROR} its worker ({run['hostname']}, pid {run['pid']}) was gone (killed or "
                    f"lost) when run {run_id} of the same point started"
                )
                still_running = (runs.c.id == run["id"]) & (runs.c.status == "running")
                values = {"status": "failed", "error": error, "finished_at": now}
                conn.execute(update(runs).where(still_running).values(values))
                conn.execute(delete(claims).where(claims.c.run_id == run["id"]))

    def finish_run(self, run_id: int, status: RunStatus = "finished", error: str | None = None) -> None:
        """Close a run with its final status (and error message, if it failed); drop its claims."""
        values = {"status": status, "error": error, "finished_at": self.clock()}
        with self.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id == run_id).values(values))
            conn.execute(delete(claims).where(claims.c.run_id == run_id))

    def claim(self, config_hash: str, sample_ids: Iterable[str], run_id: int, lease_s: float) -> set[str]:
        """Claim for ``run_id`` those of ``sample_ids`` that are neither stored nor claimed by a live
        worker (claims expire after ``lease_s`` unless renewed); return the ones this run now holds."""
        ids = [str(sample_id) for sample_id in sample_ids]
        if not ids:
            return set()
        now = self.clock()
        held = (claims.c.config_hash == config_hash) & claims.c.sample_id.in_(ids)
        holders = select(runs.c.id, runs.c.hostname, runs.c.pid).where(
            runs.c.id.in_(select(claims.c.run_id).where(held))
        )
        with self.engine.connect() as conn:
            gone = [run.id for run in conn.execute(holders) if worker_gone(run.hostname, run.pid)]
        rows = [
            {"config_hash": config_hash, "sample_id": i, "run_id": run_id, "expires_at": expiry(lease_s, now)}
            for i in ids
        ]
        stored = select(samples.c.sample_id).where(
            samples.c.config_hash == config_hash, samples.c.sample_id.in_(ids)
        )
        with self.engine.begin() as conn:  # a write first: SQLite takes its write lock before any read
            conn.execute(
                delete(claims).where(held & ((claims.c.expires_at < now) | claims.c.run_id.in_(gone)))
            )
            insert = _INSERT_ON_CONFLICT[self.engine.dialect.name](claims)
            conn.execute(insert.on_conflict_do_nothing(), rows)
            mine = set(
                conn.execute(select(claims.c.sample_id).where(held & (claims.c.run_id == run_id))).scalars()
            )
            return mine - set(conn.execute(stored).scalars())

    def renew(self, run_ids: Iterable[int], lease_s: float) -> None:
        """Heartbeat: keep the running runs ``run_ids`` and their claims alive for another ``lease_s``."""
        ids, until = list(run_ids), expiry(lease_s, self.clock())
        with self.engine.begin() as conn:
            alive = runs.c.id.in_(ids) & (runs.c.status == "running")
            conn.execute(update(runs).where(alive).values(expires_at=until))
            conn.execute(update(claims).where(claims.c.run_id.in_(ids)).values(expires_at=until))

    def run_states(self) -> list[dict[str, Any]]:
        """Every run (id, config hash, model, task, method, host, pid, created, shard, status, error),
        oldest first, its status ``stale`` where it runs but its worker is gone (:func:`run_state`)."""
        columns = ("id", "config_hash", "model", "task", "method", "hostname", "pid", "created_at")
        stored_runs = self.tables[runs.name]
        query = select(
            *(stored_runs.c[name] for name in (*columns, "status", "expires_at", "error", "config"))
        )
        with self.engine.connect() as conn:
            stored = conn.execute(query.order_by(stored_runs.c.id)).mappings().all()
        now = self.clock()
        return [
            {
                **{k: v for k, v in run.items() if k != "config"},
                "shard": (run_config(run, self.field).get("run") or {}).get("shard"),
                "status": run_state(run, now),
            }
            for run in stored
        ]

    def add_sample(self, run_id: int, config_hash: str, row: Mapping[str, Any]) -> bool:
        """Store one scored sample (keys: the ``samples`` columns); False if it was already stored.

        A sample is stored once per config: a second write of the same ``sample_id`` is ignored.
        """
        values = {
            **row,
            "sample_id": str(row["sample_id"]),
            "run_id": run_id,
            "config_hash": config_hash,
            "created_at": self.clock(),
        }
        insert = _INSERT_ON_CONFLICT[self.engine.dialect.name](samples).values(values)
        claim = (claims.c.config_hash == config_hash) & (claims.c.sample_id == values["sample_id"])
        with self.engine.begin() as conn:
            skip = insert.on_conflict_do_nothing(index_elements=["config_hash", "sample_id"])
            inserted = (
                conn.execute(skip.returning(samples.c.id)).first() is not None
            )  # (rowcount: -1 on psycopg)
            conn.execute(delete(claims).where(claim))
        return inserted

    def migrate(self) -> int:
        """Bring every stored config to today's keys (:func:`~snapeval.results.identity.upgraded`) and
        re-key its run and samples by the new hash (a sample already stored under the new hash wins);
        returns how many runs changed."""
        changed = 0
        with self.engine.begin() as conn:
            for run in conn.execute(select(runs.c.id, runs.c.config, runs.c.config_hash)).mappings().all():
                config = upgraded(run_config(run, self.field))
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
        stored = self.tables[samples.name]
        query = select(stored.c.sample_id).where(stored.c.config_hash == config_hash)
        with self.engine.connect() as conn:
            return set(conn.execute(query).scalars())

    def runs_since(self, since: datetime) -> list[dict[str, Any]]:
        """Runs created at or after ``since`` (UTC), oldest first: the points of a sweep."""
        stored = self.tables[runs.name]
        query = select(stored).where(stored.c.created_at >= since.replace(tzinfo=None)).order_by(stored.c.id)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [{**row, "config": run_config(row, self.field)} for row in rows]

    def samples_for(self, config_hash: str) -> list[dict[str, Any]]:
        """The stored samples of this config, in the order they were stored."""
        stored = self.tables[samples.name]
        query = select(stored).where(stored.c.config_hash == config_hash).order_by(stored.c.id)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def dataframe(self) -> pd.DataFrame:
        """One row per sample: its run's flattened config and provenance, then the sample's columns."""
        import pandas as pd

        stored_runs, stored_samples = self.tables[runs.name], self.tables[samples.name]
        columns = ("id", "git_sha", "status", "created_at", "config")
        with self.engine.connect() as conn:
            stored = conn.execute(select(*(stored_runs.c[name] for name in columns))).mappings().all()
            sample_rows = conn.execute(select(stored_samples).order_by(stored_samples.c.id)).mappings().all()
        run_columns = {run["id"]: _run_columns(run, run_config(run, self.field)) for run in stored}
        return pd.DataFrame.from_records(
            [{**run_columns[sample["run_id"]], **_sample_columns(sample)} for sample in sample_rows]
        )

    def add_memory_estimate(self, config: Mapping[str, Any], row: Mapping[str, Any]) -> None:
        """Store the estimate ``row`` of the memory ``config``, replacing any stored for the same config."""
        values = {
            "config_hash": config_hash(config, ignore=()),
            "config": dict(config),
            "estimate": dict(row),
            "estimated_at": self.clock(),
        }
        insert = _INSERT_ON_CONFLICT[self.engine.dialect.name](memory_estimates).values(values)
        replace = {key: insert.excluded[key] for key in ("config", "estimate", "estimated_at")}
        with self.engine.begin() as conn:
            conn.execute(insert.on_conflict_do_update(index_elements=["config_hash"], set_=replace))

    def add_decision(self, config: Mapping[str, Any], decision: Mapping[str, Any]) -> None:
        """Store a budget search's ``decision`` (:mod:`snapeval.search`), replacing any stored for the same
        search ``config``."""
        values = {
            "config_hash": config_hash(config, ignore=()),
            "config": dict(config),
            "decision": dict(decision),
            "decided_at": self.clock(),
        }
        insert = _INSERT_ON_CONFLICT[self.engine.dialect.name](decisions).values(values)
        replace = {key: insert.excluded[key] for key in ("config", "decision", "decided_at")}
        with self.engine.begin() as conn:
            conn.execute(insert.on_conflict_do_update(index_elements=["config_hash"], set_=replace))

    def decisions(self) -> list[dict[str, Any]]:
        """Every stored budget-search decision: its config, decision and when it was made, oldest first."""
        stored = self.tables[decisions.name]
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(select(stored).order_by(stored.c.id)).mappings()]

    def memory_dataframe(self) -> pd.DataFrame:
        """One row per memory estimate: the estimate's columns, its config hash and when it was made."""
        import pandas as pd

        stored_estimates = self.tables[memory_estimates.name]
        query = select(stored_estimates).order_by(stored_estimates.c.id)
        with self.engine.connect() as conn:
            stored = conn.execute(query).mappings().all()
        return pd.DataFrame.from_records(
            [
                {**row["estimate"], "config_hash": row["config_hash"], "estimated_at": row["estimated_at"]}
                for row in stored
            ]
        )


def _run_columns(run: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    flat = flatten(config)
    aliases = {alias: flat[path] for alias, path in ALIASES.items() if path in flat}
    provenance = {key: run[key] for key in ("git_sha", "status", "created_at")}
    return {**flat, **aliases, "run_id": run["id"], **provenance}


def _sample_columns(sample: Mapping[str, Any]) -> dict[str, Any]:
    columns = {key: value for key, value in sample.items() if key not in ("id", "created_at", "metrics")}
    metrics = sample["metrics"] or {}
    return {**columns, **{f"metric.{name}": value for name, value in metrics.items()}}


def load(url_or_path: str | os.PathLike[str] | None = None, field: str = "run.db") -> pd.DataFrame:
    """All samples of an existing database as a DataFrame (see :meth:`ResultsDB.dataframe`); a database
    that cannot be read is an error on ``field``."""
    with ResultsDB(url_or_path, must_exist=True, writable=False, field=field) as db:
        return db.dataframe()


def load_memory(url_or_path: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """All memory estimates of an existing database as a DataFrame; see :meth:`ResultsDB.memory_dataframe`."""
    with ResultsDB(url_or_path, must_exist=True, writable=False) as db:
        return db.memory_dataframe()
