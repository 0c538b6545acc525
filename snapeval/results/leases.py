"""Workers that may die: a running run's heartbeat, and how to tell a run whose worker is gone.

While a worker evaluates, a :class:`Lease` thread renews its runs' ``expires_at`` and its claims on
samples every quarter of ``run.lease_s``. A worker killed (SIGKILL, a lost node) stops renewing: its
claims expire and return to the other workers, and its run shows as ``stale`` in ``results summary``.
On the worker's own host a dead process is recognised at once, without waiting for the expiry.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from snapeval.configs.root import RunConfig

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
