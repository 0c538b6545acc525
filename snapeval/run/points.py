"""A run's points and what its requests carry: :class:`Point`, one cache setting of a run as this worker
runs it, and :class:`SampleCall`, a request's tag (the point and prompt of its sample, and the answers of
the sample's calls before it), which the runner, its claims (:mod:`snapeval.run.workers`) and its scoring
(:mod:`snapeval.run.evaluation`) read by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from snapeval.configs.setting import CacheSetting
from snapeval.decode.continuous import Answer
from snapeval.tasks import Prompt


@dataclass
class Point:
    """One cache setting of a run: its stored config and setting (the plan's), hash and run, the samples it
    lacked at the start, those this worker claimed (the others' claims it leaves alone) and how many it
    stored."""

    config: dict[str, Any]
    setting: CacheSetting
    digest: str
    run_id: int
    todo: set[str]
    claimed: set[str] = field(default_factory=set)
    stored: int = 0
    cut: int = 0  # of those stored, the samples whose prompt a deployed engine cut without saying so


@dataclass(frozen=True)
class SampleCall:
    """A request's tag: the sample it is a call of (its point and prompt) and the answers of that sample's
    calls so far (a two-pass task's first call, when this is its answer call)."""

    point: Point
    prompt: Prompt
    calls: tuple[Answer, ...] = ()
