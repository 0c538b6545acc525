"""Writes and reads of the results database: runs and samples committed one at a time (an interrupted
run resumes from what it stored), memory estimates, and the whole database as a DataFrame."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, delete, select, update

from snapeval.configs.protocols import flatten
from snapeval.results.connect import database_url, open_engine
from snapeval.results.identity import ALIASES, DEPLOYMENT_COLUMNS, config_hash, run_config, upgraded
from snapeval.results.leases import Clock, RunLedger, insert_into, run_state, utcnow
from snapeval.results.schema import (
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


class ResultsDB(RunLedger):
    """Runs and their samples. Each write commits at once, so a killed run keeps what it stored; runs
    start and close, and claims are taken, through :class:`~snapeval.results.leases.RunLedger`."""

    def __init__(
        self,
        url: str | os.PathLike[str] | None = None,
        *,
        must_exist: bool = False,
        writable: bool = True,
        field: str = "run.db",
        clock: Clock = utcnow,
        tensor_parallel: int = 1,
    ):
        """Open (and create, unless ``must_exist``) the database at ``url`` (see :func:`database_url`),
        proven writable, or only read when ``writable`` is false (its tables as stored: an older
        snapeval's read as today's); a failure is a :class:`SnapevalError` on ``field``. ``clock`` is the
        time that runs, samples and leases are stamped and expired with; ``tensor_parallel`` the ranks the
        model of the runs it starts is split across (their ``tensor_parallel`` column)."""
        self.url, self.clock, self.field = database_url(url), clock, field
        self.tensor_parallel = tensor_parallel
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
        insert = insert_into(self.engine, samples).values(values)
        claim = (claims.c.config_hash == config_hash) & (claims.c.sample_id == values["sample_id"])
        with self.engine.begin() as conn:
            skip = insert.on_conflict_do_nothing(index_elements=["config_hash", "sample_id"])
            inserted = (
                conn.execute(skip.returning(samples.c.id)).first() is not None
            )  # (rowcount: -1 on psycopg)
            conn.execute(delete(claims).where(claim))
        return inserted

    def record_engine(self, run_ids: Iterable[int], engine: Mapping[str, Any]) -> None:
        """Store who answers the runs ``run_ids``: a deployed engine's identity, or snapeval's own engine with
        how it holds the weights (``fp8 kernels``, ``fp8 dequantized to float32``, ``bfloat16``, ...)."""
        with self.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id.in_(list(run_ids))).values(engine=dict(engine)))

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
        return self.done_by_hash([config_hash])[config_hash]

    def done_by_hash(self, config_hashes: Iterable[str]) -> dict[str, set[str]]:
        """:meth:`done_sample_ids` of each of ``config_hashes``, in one query."""
        done: dict[str, set[str]] = {digest: set() for digest in config_hashes}
        stored = self.tables[samples.name]
        query = select(stored.c.config_hash, stored.c.sample_id).where(stored.c.config_hash.in_(list(done)))
        with self.engine.connect() as conn:
            for digest, sample_id in conn.execute(query):
                done[digest].add(sample_id)
        return done

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
        insert = insert_into(self.engine, memory_estimates).values(values)
        replace = {key: insert.excluded[key] for key in ("config", "estimate", "estimated_at")}
        with self.engine.begin() as conn:
            conn.execute(insert.on_conflict_do_update(index_elements=["config_hash"], set_=replace))

    def add_decision(self, config: Mapping[str, Any], decision: Mapping[str, Any]) -> None:
        """Store a budget search's ``decision`` (:mod:`snapeval.commands.search`), replacing any stored for
        the same search ``config``."""
        values = {
            "config_hash": config_hash(config, ignore=()),
            "config": dict(config),
            "decision": dict(decision),
            "decided_at": self.clock(),
        }
        insert = insert_into(self.engine, decisions).values(values)
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
    deployed = {column: flat.get(column) for column in DEPLOYMENT_COLUMNS}  # after the config's own columns
    return {**flat, **deployed, **aliases, "run_id": run["id"], **provenance}


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
