"""Workers that may die: a running run's heartbeat, and how to tell a run whose worker is gone.

While a worker evaluates, a :class:`Lease` thread renews its runs' ``expires_at`` and its claims on
samples every quarter of ``run.lease_s``. A worker killed (SIGKILL, a lost node) stops renewing: its
claims expire and return to the other workers, and its run shows as ``stale`` in ``results summary``.
On the worker's own host a dead process is recognised at once, without waiting for the expiry.

:class:`RunLedger` is the database side (a part of :class:`~snapeval.results.ResultsDB`): runs started
and closed, claims taken and renewed, each call one transaction however many runs or samples it covers
(a grid of a thousand settings starts, claims and closes in a few).
"""

from __future__ import annotations

import os
import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from snapeval.configs.protocols import flatten
from snapeval.configs.root import RunConfig
from snapeval.results.identity import ALIASES, git_sha, package_versions
from snapeval.results.schema import RunStatus, claims, runs, samples

DEFAULT_LEASE_S: int = RunConfig.lease_s  # run.lease_s's default
STALE_ERROR = "stale:"  # how the error of a run closed because its worker was found gone begins


#: Where the results database reads the time (:class:`~snapeval.results.ResultsDB`'s ``clock``).
Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """The time now, in UTC: the default :data:`Clock`."""
    return datetime.now(timezone.utc)


def expiry(lease_s: float, now: datetime) -> datetime:
    """When a lease of ``lease_s`` seconds taken at ``now`` runs out."""
    return now + timedelta(seconds=lease_s)


def worker_gone(hostname: str | None, pid: int | None) -> bool:
    """True when the worker ``pid`` ran on this host and its process no longer exists."""
    if hostname != socket.gethostname() or pid is None or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, under another user
        return False
    return False


def run_state(run: Mapping[str, Any], now: datetime) -> str:
    """A run's status at ``now`` as stored, or ``stale`` for a ``running`` run whose worker is gone (its
    heartbeat expired, or its process on this host has ended), and for one closed as such
    (:data:`STALE_ERROR`)."""
    if run["status"] == "failed" and str(run.get("error") or "").startswith(STALE_ERROR):
        return "stale"
    if run["status"] != "running":
        return run["status"]
    expires = run.get("expires_at") or run["created_at"]  # runs stored before heartbeats: their start
    if expires.tzinfo is None:  # SQLite returns naive UTC
        expires = expires.replace(tzinfo=timezone.utc)
    if expires < now or worker_gone(run.get("hostname"), run.get("pid")):
        return "stale"
    return "running"


class Lease:
    """Renews ``renew`` (a worker's runs and claims) every quarter of ``lease_s`` from a daemon thread,
    while the ``with`` block runs."""

    def __init__(self, renew: Callable[[], None], lease_s: float) -> None:
        self.renew, self.interval = renew, lease_s / 4
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="snapeval-lease", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.renew()
            except Exception:  # a database hiccup: the next beat tries again, well within the lease
                continue

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def needing_attention(states: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The runs a user should know of (from :meth:`ResultsDB.run_states`): every running one, and each
    stale, interrupted or failed one that no later run of the same config and shard finished."""
    finished_after: dict[tuple[str, Any], int] = {}
    for run in states:
        if run["status"] == "finished":
            finished_after[run["config_hash"], run.get("shard")] = run["id"]
    return [
        run
        for run in states
        if run["status"] == "running"
        or (
            run["status"] != "finished"
            and finished_after.get((run["config_hash"], run.get("shard")), -1) < run["id"]
        )
    ]


class RunLedger:
    """Runs and claims in the database (:class:`~snapeval.results.ResultsDB` is one): each method is one
    transaction, whatever the number of runs or samples it covers."""

    engine: Engine
    clock: Clock

    def start_run(self, config: Mapping[str, Any], config_hash: str, lease_s: float = DEFAULT_LEASE_S) -> int:
        """Record a new running run of ``config`` (see :meth:`start_runs`); return its id."""
        return self.start_runs([(config, config_hash)], lease_s)[0]

    def start_runs(
        self, configs: Sequence[tuple[Mapping[str, Any], str]], lease_s: float = DEFAULT_LEASE_S
    ) -> list[int]:
        """Record a new running run per ``(config, config hash)`` with its provenance, alive for
        ``lease_s`` unless renewed (:class:`Lease`); return their ids. Runs of the same configs still
        ``running`` whose worker is gone are closed as stale."""
        return self._insert_runs([(config, digest, None) for config, digest in configs], lease_s)

    def record_failures(self, failures: Sequence[tuple[Mapping[str, Any], str, str]]) -> list[int]:
        """Record a failed run per ``(config, config hash, error)``: a point that could not run."""
        return self._insert_runs(failures, 0)

    def _insert_runs(
        self, entries: Sequence[tuple[Mapping[str, Any], str, str | None]], lease_s: float
    ) -> list[int]:
        """Insert a run per ``(config, config hash, error or None)`` and, in the same transaction, close
        as failed the runs of those configs still ``running`` whose worker is gone (killed, its node
        lost), naming why, and drop their claims."""
        now = self.clock()
        common = {
            "created_at": now,
            "git_sha": git_sha(),
            "versions": package_versions(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "tensor_parallel": getattr(self, "tensor_parallel", 1),  # ranks the model was split across
            "expires_at": expiry(lease_s, now),
        }
        with self.engine.begin() as conn:  # a write first: SQLite takes its write lock before any read
            ids = [
                conn.execute(
                    runs.insert().values({**common, **_run_values(*entry, now)})
                ).inserted_primary_key[0]
                for entry in entries
            ]
            started = {digest: run_id for (_, digest, _), run_id in zip(entries, ids, strict=True)}
            others = (runs.c.status == "running") & runs.c.config_hash.in_(list(started))
            query = select(runs).where(others & runs.c.id.notin_(ids))
            dead = [run for run in conn.execute(query).mappings() if run_state(run, now) == "stale"]
            for run in dead:
                error = (
                    f"{STALE_ERROR} its worker ({run['hostname']}, pid {run['pid']}) was gone (killed or "
                    f"lost) when run {started[run['config_hash']]} of the same point started"
                )
                values = {"status": "failed", "error": error, "finished_at": now}
                conn.execute(update(runs).where(runs.c.id == run["id"]).values(values))
            conn.execute(delete(claims).where(claims.c.run_id.in_([run["id"] for run in dead])))
        return ids

    def finish_run(self, run_id: int, status: RunStatus = "finished", error: str | None = None) -> None:
        """Close a run with its final status (and error message, if it failed); drop its claims."""
        self.finish_runs([run_id], status, error)

    def finish_runs(self, run_ids: Iterable[int], status: RunStatus, error: str | None = None) -> None:
        """Close the runs ``run_ids`` with one status (and error message); drop their claims."""
        ids, values = list(run_ids), {"status": status, "error": error, "finished_at": self.clock()}
        if not ids:
            return
        with self.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id.in_(ids)).values(values))
            conn.execute(delete(claims).where(claims.c.run_id.in_(ids)))

    def claim(self, config_hash: str, sample_ids: Iterable[str], run_id: int, lease_s: float) -> set[str]:
        """Claim for ``run_id`` those of ``sample_ids`` that are neither stored nor claimed by a live
        worker (claims expire after ``lease_s`` unless renewed); return the ones this run now holds."""
        return self.claim_points({config_hash: (run_id, sample_ids)}, lease_s)[config_hash]

    def claim_points(
        self, wanted: Mapping[str, tuple[int, Iterable[str]]], lease_s: float
    ) -> dict[str, set[str]]:
        """:meth:`claim` for several points at once: ``wanted`` maps each config hash to its run and the
        sample ids it asks for; returns, per config hash, the ids that run now holds."""
        asked = {digest: (run_id, {str(i) for i in ids}) for digest, (run_id, ids) in wanted.items()}
        ids = sorted({i for _, sample_ids in asked.values() for i in sample_ids})
        if not ids:
            return {digest: set() for digest in asked}
        now = self.clock()
        held = claims.c.config_hash.in_(list(asked)) & claims.c.sample_id.in_(ids)  # asked pairs, and more
        holders = select(runs.c.id, runs.c.hostname, runs.c.pid).where(
            runs.c.id.in_(select(claims.c.run_id).where(held))
        )
        with self.engine.connect() as conn:
            gone = [run.id for run in conn.execute(holders) if worker_gone(run.hostname, run.pid)]
        until = expiry(lease_s, now)
        rows = [
            {"config_hash": digest, "sample_id": i, "run_id": run_id, "expires_at": until}
            for digest, (run_id, sample_ids) in asked.items()
            for i in sorted(sample_ids)
        ]
        pairs = (claims.c.config_hash, claims.c.sample_id, claims.c.run_id)
        stored = select(samples.c.config_hash, samples.c.sample_id).where(
            samples.c.config_hash.in_(list(asked)), samples.c.sample_id.in_(ids)
        )
        with self.engine.begin() as conn:  # a write first: SQLite takes its write lock before any read
            conn.execute(
                delete(claims).where(held & ((claims.c.expires_at < now) | claims.c.run_id.in_(gone)))
            )
            conn.execute(insert_into(self.engine, claims).on_conflict_do_nothing(), rows)
            holding = conn.execute(select(*pairs).where(held)).all()
            done = set(conn.execute(stored).all())
        mine: dict[str, set[str]] = defaultdict(set)
        for digest, sample_id, run_id in holding:
            if (
                asked[digest][0] == run_id
                and sample_id in asked[digest][1]
                and (digest, sample_id) not in done
            ):
                mine[digest].add(sample_id)
        return {digest: mine[digest] for digest in asked}

    def renew(self, run_ids: Iterable[int], lease_s: float) -> None:
        """Heartbeat: keep the running runs ``run_ids`` and their claims alive for another ``lease_s``."""
        ids, until = list(run_ids), expiry(lease_s, self.clock())
        with self.engine.begin() as conn:
            alive = runs.c.id.in_(ids) & (runs.c.status == "running")
            conn.execute(update(runs).where(alive).values(expires_at=until))
            conn.execute(update(claims).where(claims.c.run_id.in_(ids)).values(expires_at=until))


def _run_values(config: Mapping[str, Any], digest: str, error: str | None, now: datetime) -> dict[str, Any]:
    """The columns of a new run of ``config``: running, or failed with ``error``."""
    flat = flatten(config)
    closed = {"status": "failed", "error": error, "finished_at": now} if error is not None else {}
    return {
        "status": "running",
        "config": dict(config),
        "config_hash": digest,
        "model": flat.get(ALIASES["model"]),
        "task": flat.get(ALIASES["task"]),
        "method": flat.get(ALIASES["method"]),
        **closed,
    }


def insert_into(engine: Engine, table: Any) -> Any:
    """An INSERT into ``table`` in ``engine``'s dialect (SQLite or PostgreSQL), which can skip or replace
    a row already stored (``on_conflict_do_nothing``, ``on_conflict_do_update``)."""
    return {"sqlite": sqlite.insert, "postgresql": postgresql.insert}[engine.dialect.name](table)
