"""How one worker shares its work with others: a deterministic shard of the samples (``run.shard``),
claims on samples in the results database as it goes (workers started on one point split it, and a dead
worker's claims return after ``run.lease_s``), and SIGTERM ending a run as interrupted, not as running.

Requests carry ``tag = (point, prompt, calls)`` (:mod:`snapeval.runner`); a point has ``digest``
(its config hash), ``run_id`` and ``claimed`` (the sample ids this worker holds).
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from itertools import groupby

from snapeval.continuous import Request
from snapeval.results import ResultsDB
from snapeval.tasks import Prompt


def shard(prompts: list[Prompt], spec: str | None) -> list[Prompt]:
    """The ``i``-th of ``n`` contiguous, near-equal slices of ``prompts`` for ``run.shard`` = ``i/n``
    (all of them for null): n shards together hold every prompt once, in order."""
    if spec is None:
        return prompts
    index, count = map(int, spec.split("/"))
    return prompts[len(prompts) * index // count : len(prompts) * (index + 1) // count]


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's preemption or time limit): the run stops as if interrupted."""


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` while the block runs (main thread only; others cannot)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class ClaimingFeed:
    """Hands the batcher the queued requests of one problem (its draws and grid points together) at a
    time, after claiming their samples in the database: a sample that another live worker claimed or
    stored is skipped, so that workers on one point split its samples."""

    def __init__(self, db: ResultsDB, queued: list[Request], batch_size: int, lease_s: float) -> None:
        self.db, self.batch_size, self.lease_s = db, batch_size, lease_s
        self.problems = deque(list(group) for _, group in groupby(queued, key=_problem_of))
        self.claimed_any = False

    def next(self) -> list[Request]:
        """The next problems' requests that this worker claimed (a batch's worth, unless none are left)."""
        handed: list[Request] = []
        while self.problems and len(handed) < self.batch_size:
            problem = self.problems.popleft()
            mine: dict[str, set[str]] = {}
            for point in {request.tag[0].digest: request.tag[0] for request in problem}.values():
                ids = [request.tag[1].id for request in problem if request.tag[0] is point]
                mine[point.digest] = self.db.claim(point.digest, ids, point.run_id, self.lease_s)
                point.claimed |= mine[point.digest]
            handed += [request for request in problem if request.tag[1].id in mine[request.tag[0].digest]]
        self.claimed_any |= bool(handed)
        return handed


def stored_in(request: Request, done: Mapping[str, set[str]]) -> bool:
    point, prompt = request.tag[0], request.tag[1]
    return prompt.id in done[point.digest]


def _problem_of(request: Request) -> str:
    prompt = request.tag[1]
    return str(prompt.metadata.get("problem", prompt.id))
