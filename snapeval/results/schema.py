"""The results database's tables: runs, their scored samples, the claims of workers on samples, memory
estimates and budget searches' decisions.

A running run renews ``expires_at`` while its worker lives (:class:`snapeval.results.leases.Lease`); a
``running`` run past it, or whose process on this host is gone, is shown as ``stale``. A claim keeps
other workers off a sample until it is stored or its expiry passes (the worker died).

A database written by an older snapeval lacks some tables (``claims``, ``decisions``) and nullable
columns until a writer opens it; a reader sees it through :func:`stored_tables`: missing tables as empty,
missing columns as NULL, or as :func:`stored_before` derives them from what the older snapeval stored."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    case,
    false,
    inspect,
    null,
    select,
    type_coerce,
)

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement, Engine, FromClause

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
    Column("pid", Integer),
    Column("tensor_parallel", Integer),  # ranks the model was split across (torchrun); NULL: older runs
    Column("expires_at", DateTime(timezone=True)),  # the worker's heartbeat: renewed while it runs
    Column("config", JSON(none_as_null=True), nullable=False),
    Column("config_hash", String(64), nullable=False, index=True),
    Column("model", String(255)),
    Column("task", String(255)),
    Column("method", String(64)),
    Column("engine", JSON(none_as_null=True)),  # who answered: a deployed engine, or snapeval
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
    Column("kv_bytes", BigInteger),  # the row's keys and values on one device: over every rank under TP
    Column("kv_bytes_per_rank", BigInteger),  # the share of them one rank held (kv_bytes without TP)
    Column("extra", JSON(none_as_null=True)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("config_hash", "sample_id", name="uq_samples_config_sample"),
)

claims = Table(
    "claims",
    metadata,
    Column("config_hash", String(64), primary_key=True),
    Column("sample_id", String(255), primary_key=True),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False, index=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
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

decisions = Table(
    "decisions",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("config_hash", String(64), nullable=False, unique=True),
    Column("config", JSON(none_as_null=True), nullable=False),  # model, task, search settings
    Column("decision", JSON(none_as_null=True), nullable=False),  # snapeval.commands.search.Decision.stored()
    Column("decided_at", DateTime(timezone=True), nullable=False),
)


def required_columns(table: Table) -> list[str]:
    """The columns of ``table`` that every snapeval database has had: the NOT NULL ones, which a table
    created by an older snapeval already had (newer columns are nullable, added by ``create_schema``)."""
    return [column.name for column in table.columns if not column.nullable]


def stored_before(table: Table, columns: set[str], tensor_parallel: bool) -> dict[str, ColumnElement[Any]]:
    """What a database that holds only ``columns`` of ``table`` stored of its newer columns, in the place
    of an older one, as today's columns read it, by column name; ``tensor_parallel``: its runs have that
    column (a database without it ran nothing split across ranks).

    Samples stored before ``kv_bytes_per_rank`` hold one rank's share in ``kv_bytes``: that is their
    ``kv_bytes_per_rank``, and their ``kv_bytes`` where their run had no TP; NULL where it had, as the share
    does not tell the whole (a family's TP plan splits its KV heads, or holds them all on every rank)."""
    if table is not samples or "kv_bytes_per_rank" in columns or "kv_bytes" not in columns:
        return {}
    if not tensor_parallel:
        return {"kv_bytes_per_rank": samples.c.kv_bytes}
    degree = select(runs.c.tensor_parallel).where(runs.c.id == samples.c.run_id).scalar_subquery()
    return {
        "kv_bytes": case((degree > 1, null()), else_=samples.c.kv_bytes),
        "kv_bytes_per_rank": samples.c.kv_bytes,
    }


def stored_tables(engine: Engine) -> dict[str, FromClause]:
    """Each of snapeval's tables as ``engine``'s database holds it (:func:`as_stored`), by name."""
    inspector = inspect(engine)
    present = {
        name: {column["name"] for column in inspector.get_columns(name)}
        for name in inspector.get_table_names()
        if name in metadata.tables
    }
    split = "tensor_parallel" in present.get(runs.name, set())
    return {table.name: as_stored(table, present.get(table.name), split) for table in metadata.sorted_tables}


def as_stored(table: Table, columns: set[str] | None, tensor_parallel: bool) -> FromClause:
    """``table`` where a database holds only ``columns`` of it (None: not the table): the table itself
    when it has them all, else its columns with the missing ones NULL (or as :func:`stored_before` derives
    them; ``tensor_parallel`` as there), or no rows."""
    if columns is not None and columns >= set(table.columns.keys()):
        return table
    derived = stored_before(table, columns, tensor_parallel) if columns else {}
    values = [
        derived[column.name]
        if column.name in derived
        else table.c[column.name]
        if columns and column.name in columns
        else type_coerce(null(), column.type)
        for column in table.columns
    ]
    query = select(*(value.label(column.name) for value, column in zip(values, table.columns, strict=True)))
    return (query.select_from(table) if columns is not None else query.where(false())).subquery(table.name)
