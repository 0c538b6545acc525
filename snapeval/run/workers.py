"""How one worker shares its work with others: a deterministic shard of the samples (``run.shard``),
claims on samples in the results database as it goes (workers started on one point split it, and a dead
worker's claims return after ``run.lease_s``).

A grid of more than :data:`SETTINGS_PER_PREFILL` settings is handed to the batcher that many at a time
per problem (the first time, only as many as it has rows), each group claimed in one transaction: memory
and the wait for the first answer stay bounded however many settings the grid has.

Requests carry a :class:`~snapeval.run.points.SampleCall` tag (its point: ``digest``, its config hash,
``run_id`` and ``claimed``, the sample ids this worker holds; its prompt).
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping

from snapeval.decode.continuous import Request
from snapeval.results import ResultsDB
from snapeval.tasks import Prompt

SETTINGS_PER_PREFILL = 64
"""The most settings of a grid that share one prefill of a problem: each holds its compressed prompt
until a row takes it, so a larger grid prefills each problem once per this many settings, and its first
group only fills the rows (its answers come about as soon as one setting's would)."""


def shard(prompts: list[Prompt], spec: str | None) -> list[Prompt]:
    """The ``i``-th of ``n`` contiguous, near-equal slices of ``prompts`` for ``run.shard`` = ``i/n``
    (all of them for null): n shards together hold every prompt once, in order."""
    if spec is None:
        return prompts
    index, count = map(int, spec.split("/"))
    return prompts[len(prompts) * index // count : len(prompts) * (index + 1) // count]


class ClaimingFeed:
    """Hands the batcher the queued requests of one problem (its draws and grid points together; a
    larger grid's in groups of points, see :data:`SETTINGS_PER_PREFILL`) at a time, after claiming their
    samples in the database: a sample that another live worker claimed or stored is skipped, so that
    workers on one point split its samples."""

    def __init__(self, db: ResultsDB, queued: list[Request], batch_size: int, lease_s: float) -> None:
        self.db, self.batch_size, self.lease_s = db, batch_size, lease_s
        split = len({request.tag.point.digest for request in queued}) > SETTINGS_PER_PREFILL
        first = min(batch_size, SETTINGS_PER_PREFILL) if split else SETTINGS_PER_PREFILL
        sizes = itertools.chain([first], itertools.repeat(SETTINGS_PER_PREFILL))
        self.groups = deque(
            group
            for _, problem in itertools.groupby(queued, key=_problem_of)
            for group in _by_points(problem, sizes)
        )
        self.claimed_any = False

    def next(self) -> list[Request]:
        """The next groups' requests that this worker claimed (a batch's worth, unless none are left)."""
        handed: list[Request] = []
        while self.groups and len(handed) < self.batch_size:
            group = self.groups.popleft()
            points, ids = {}, defaultdict(list)
            for request in group:
                point, prompt = request.tag.point, request.tag.prompt
                points[point.digest] = point
                ids[point.digest].append(prompt.id)
            wanted = {digest: (point.run_id, ids[digest]) for digest, point in points.items()}
            mine = self.db.claim_points(wanted, self.lease_s)
            for digest, point in points.items():
                point.claimed |= mine[digest]
            handed += [request for request in group if stored_in(request, mine)]
        self.claimed_any |= bool(handed)
        return handed


def _by_points(problem: Iterable[Request], sizes: Iterator[int]) -> list[list[Request]]:
    """A problem's requests in groups of whole points, in order, each of as many points as ``sizes``
    gives next."""
    group_of: dict[str, int] = {}
    groups: list[list[Request]] = []
    room = 0  # points the groups so far can hold
    for request in problem:
        digest = request.tag.point.digest
        if digest not in group_of:
            if len(group_of) == room:
                groups.append([])
                room += next(sizes)
            group_of[digest] = len(groups) - 1
        groups[group_of[digest]].append(request)
    return groups


def stored_in(request: Request, samples: Mapping[str, set[str]]) -> bool:
    """Whether ``request``'s sample is among ``samples`` (sample ids by config hash: stored, or claimed)."""
    return request.tag.prompt.id in samples[request.tag.point.digest]


def _problem_of(request: Request) -> str:
    prompt = request.tag.prompt
    return str(prompt.metadata.get("problem", prompt.id))
