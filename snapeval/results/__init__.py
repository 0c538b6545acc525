"""The results database: one row per run and per scored sample, written as the evaluation goes.

SQLite by default (``results/snapeval.sqlite``, or ``$SNAPEVAL_DB``), in WAL mode with a busy
timeout so that the processes of a Hydra multirun can write to it at once; any SQLAlchemy URL
otherwise, such as ``postgresql://host/db`` for a database shared between machines. Samples are
keyed by the hash of the run's config (:func:`config_hash`), so an interrupted or extended run
resumes from the samples already stored. Memory estimates (``job=memory``) go in their own table,
one row per memory config (:meth:`ResultsDB.add_memory_estimate`, :func:`load_memory`).

Several workers share one database: each claims the samples it evaluates (claims expire when a worker
dies), so workers on one point split its samples, and a run whose worker is gone shows as ``stale``.

The package is split by concern: :mod:`~snapeval.results.schema` (tables),
:mod:`~snapeval.results.connect` (URLs, opening, errors on ``run.db``),
:mod:`~snapeval.results.identity` (stored config, config hash, provenance),
:mod:`~snapeval.results.store` (writes, claims, resume, loading),
:mod:`~snapeval.results.leases` (heartbeats, stale runs) and
:mod:`~snapeval.results.summary` (accuracy and speed per experiment).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snapeval.configs.protocols import flatten
from snapeval.results.connect import DB_ENV_VAR, DEFAULT_DB, database_url, sqlite_path
from snapeval.results.identity import ALIASES, UNHASHED, config_hash, identity, stored_config
from snapeval.results.leases import DEFAULT_LEASE_S
from snapeval.results.schema import RUN_STATUSES, RunStatus
from snapeval.results.store import ResultsDB, load, load_memory

if TYPE_CHECKING:
    from snapeval.results.summary import (
        config_columns,
        experiment_keys,
        hashable,
        summarize,
        summary_of,
        trace_summary,
    )

_SUMMARY = ("config_columns", "experiment_keys", "hashable", "summarize", "summary_of", "trace_summary")


def __getattr__(name: str) -> Any:
    """The summary's functions, imported on first use: they need pandas and scipy, which opening a
    database (or refusing one, before a run starts) does not."""
    if name in _SUMMARY:
        from snapeval.results import summary

        return getattr(summary, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALIASES",
    "DB_ENV_VAR",
    "DEFAULT_DB",
    "DEFAULT_LEASE_S",
    "RUN_STATUSES",
    "ResultsDB",
    "RunStatus",
    "UNHASHED",
    "config_columns",
    "config_hash",
    "database_url",
    "experiment_keys",
    "flatten",
    "hashable",
    "identity",
    "load",
    "load_memory",
    "sqlite_path",
    "stored_config",
    "summarize",
    "summary_of",
    "trace_summary",
]
