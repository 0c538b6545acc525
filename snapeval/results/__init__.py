"""The results database: one row per run and per scored sample, written as the evaluation goes.

SQLite by default (``results/snapeval.sqlite``, or ``$SNAPEVAL_DB``), in WAL mode with a busy
timeout so that the processes of a Hydra multirun can write to it at once; any SQLAlchemy URL
otherwise, such as ``postgresql://host/db`` for a database shared between machines. Samples are
keyed by the hash of the run's config (:func:`config_hash`), so an interrupted or extended run
resumes from the samples already stored. Memory estimates (``job=memory``) go in their own table,
one row per memory config (:meth:`ResultsDB.add_memory_estimate`, :func:`load_memory`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, get_args

import pandas as pd
from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    make_url,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from snapeval.errors import SnapevalError
from snapeval.stats import mean_ci, pass_at

DEFAULT_DB = Path("results/snapeval.sqlite")
DB_ENV_VAR = "SNAPEVAL_DB"
BUSY_TIMEOUT_MS = 30_000

#: Config keys (dotted paths) that do not change what a sample's result is, left out of
#: :func:`config_hash`: where results go, Hydra's own settings, progress display, the memory
#: estimator's settings, and ``task.limit`` so that a run with a larger limit reuses the samples
#: of a smaller one, and how answers are decoded (``generation.batch_size``, ``compile``; the retired
#: ``draw_batch``): every path gives the same answers.
DEFAULT_IGNORED: tuple[str, ...] = (
    "db",
    "hydra",
    "progress",
    "memory",
    "task.limit",
    "generation.draw_batch",
    "generation.batch_size",
    "generation.compile",
)

#: Short column names in :func:`load`, for the config keys that identify an experiment.
ALIASES: dict[str, str] = {
    "model": "model.name",
    "task": "task.name",
    "method": "cache.method",
    "budget": "cache.budget",
    "window": "cache.window",
    "kernel": "cache.kernel",
    "pooling": "cache.pooling",
}

#: Distribution of each package whose version a run records.
VERSIONED_PACKAGES: dict[str, str] = {
    "torch": "torch",
    "transformers": "transformers",
    "lm_eval": "lm-eval",
    "snapeval": "snapeval",
}

RunStatus = Literal["running", "finished", "failed", "interrupted"]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)

metadata = MetaData()

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    Column("status", String(16), nullable=False),
    Column("error", Text),
    Column("git_sha", String(40)),
    Column("versions", JSON(none_as_null=True)),
    Column("hostname", String(255)),
    Column("config", JSON(none_as_null=True), nullable=False),
    Column("config_hash", String(64), nullable=False, index=True),
    Column("model", String(255)),
    Column("task", String(255)),
    Column("method", String(64)),
    CheckConstraint(f"status IN {RUN_STATUSES}", name="ck_runs_status"),
    Index("ix_runs_model_task_method", "model", "task", "method"),
)

samples = Table(
    "samples",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False),
    Column("config_hash", String(64), nullable=False),
    Column("sample_id", String(255), nullable=False),
    Column("prompt_tokens", Integer),
    Column("output", Text),
    Column("target", JSON(none_as_null=True)),
    Column("score", Float),
    Column("metrics", JSON(none_as_null=True)),
    Column("prefill_s", Float),
    Column("decode_s", Float),
    Column("generated_tokens", Integer),
    Column("peak_memory_bytes", BigInteger),
    Column("kv_bytes", BigInteger),
    Column("extra", JSON(none_as_null=True)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("config_hash", "sample_id", name="uq_samples_config_sample"),
)

memory_estimates = Table(
    "memory_estimates",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("config_hash", String(64), nullable=False, unique=True),
    Column("config", JSON(none_as_null=True), nullable=False),
    Column("estimate", JSON(none_as_null=True), nullable=False),
    Column("estimated_at", DateTime(timezone=True), nullable=False),
)

#: The supported databases, with their INSERT that can skip or replace a row already stored.
_INSERT_ON_CONFLICT = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def config_hash(config: Mapping[str, Any], ignore: Iterable[str] = DEFAULT_IGNORED) -> str:
    """SHA-256 of the canonical JSON of ``config`` without the ``ignore`` dotted keys."""
    for path in ignore:
        config = _without(config, path)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _without(config: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    head, _, rest = path.partition(".")
    if head not in config:
        return config
    if not rest:
        return {key: value for key, value in config.items() if key != head}
    child = config[head]
    return {**config, head: _without(child, rest)} if isinstance(child, Mapping) else config


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: ``{"cache": {"budget": 8}}`` -> ``{"cache.budget": 8}``."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


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


def _git_sha() -> str | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in VERSIONED_PACKAGES.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


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
            "git_sha": _git_sha(),
            "versions": _versions(),
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


def config_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``df`` (from :func:`load`) that hold the stored config, less what
    :data:`DEFAULT_IGNORED` leaves out of the config hash: together, they tell experiments apart."""
    not_config = {*samples.c.keys(), *ALIASES, "git_sha", "status", "created_at"}

    def ignored(column: str) -> bool:
        return any(column == key or column.startswith(f"{key}.") for key in DEFAULT_IGNORED)

    return [c for c in df.columns if c not in not_config and not c.startswith("metric.") and not ignored(c)]


def experiment_keys(df: pd.DataFrame) -> list[str]:
    """The :data:`ALIASES` columns ``df`` has, then every other config column whose value differs
    between configs that share those: grouping by them never pools two experiments."""
    aliases = [alias for alias in ALIASES if alias in df.columns]
    aliased = {ALIASES[alias] for alias in aliases}
    others = [column for column in config_columns(df) if column not in aliased]
    values = df[others].map(hashable)
    by_aliases = values.groupby([df[a].map(hashable) for a in aliases], dropna=False) if aliases else None
    if by_aliases is None:
        return [column for column in others if values[column].nunique(dropna=False) > 1]
    varying = by_aliases.nunique(dropna=False).max() if len(values) else pd.Series(dtype=int)
    return aliases + [column for column in others if varying.get(column, 1) > 1]


def hashable(value: object) -> object:
    """A config value that pandas can group by: lists and dicts as sorted JSON."""
    return json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else value


def summarize(df: pd.DataFrame, keys: Sequence[str] | None = None) -> pd.DataFrame:
    """Accuracy with its confidence interval, KV size and speed per group of ``keys`` (by default
    :func:`experiment_keys`: one row per experiment, the config columns that set it apart shown).

    ``decode_tok_s`` is the total of generated tokens over the total decode time; ``trace_tokens`` and
    ``truncated`` describe the (first-call) traces, see :func:`trace_summary`.
    """
    keys = list(keys) if keys is not None else experiment_keys(df)
    df = df.assign(**{key: df[key].map(hashable) for key in keys})
    groups = df.groupby(keys, dropna=False, sort=True) if keys else [((), df)]
    rows = []
    for key, group in groups:
        accuracy, ci_low, ci_high = mean_ci(group["score"].dropna())
        decode_s = group["decode_s"].sum()
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                "accuracy": accuracy,
                "ci_low": ci_low,
                "ci_high": ci_high,
                "n": int(group["score"].notna().sum()),
                "kv_mib": group["kv_bytes"].mean() / 2**20,
                "prefill_s": group["prefill_s"].mean(),
                "decode_tok_s": group["generated_tokens"].sum() / decode_s if decode_s > 0 else float("nan"),
                **trace_summary(group.get("extra", [])),
                **(pass_at(group["sample_id"], group["score"]) if "sample_id" in group else {}),
            }
        )
    return pd.DataFrame(rows)


def trace_summary(extras: Iterable[Any]) -> dict[str, float]:
    """Mean generated tokens of the samples' traces and the share that hit ``max_new_tokens``
    (``extra.trace``, stored by the runner); NaN where no sample has one."""
    traces = [extra["trace"] for extra in extras if isinstance(extra, dict) and extra.get("trace")]
    if not traces:
        return {"trace_tokens": float("nan"), "truncated": float("nan")}
    return {
        "trace_tokens": sum(t["generated_tokens"] for t in traces) / len(traces),
        "truncated": sum(bool(t["truncated"]) for t in traces) / len(traces),
    }
