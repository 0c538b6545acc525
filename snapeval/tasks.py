"""What the runner needs from a task: chat prompts with ids, a generation length, and a scorer.

Tasks know nothing of caches. :func:`load_task` turns the ``task`` config group into an :class:`EvalTask`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from transformers import PreTrainedTokenizerBase

from snapeval import synthetic
from snapeval.errors import SnapevalError


@dataclass(frozen=True)
class Prompt:
    """One sample: a stable id, the chat messages fed to the model, the reference, and extra metadata."""

    id: str
    messages: list[dict[str, str]]
    target: Any
    metadata: dict[str, Any] = field(default_factory=dict)


class EvalTask(Protocol):
    name: str
    max_new_tokens: int

    def prompts(self, tokenizer: PreTrainedTokenizerBase) -> list[Prompt]:
        """Every sample of the task, in a fixed order."""

    def score(self, prompt: Prompt, output: str) -> dict[str, float]:
        """Metrics of one output; ``score`` is the headline metric in [0, 1]."""


@dataclass(frozen=True)
class SyntheticTask:
    """An offline RULER-style family from :mod:`snapeval.synthetic`, generated at ``context_length``."""

    name: str
    kind: str
    context_length: int
    num_samples: int
    seed: int
    max_new_tokens: int

    def prompts(self, tokenizer: PreTrainedTokenizerBase) -> list[Prompt]:
        samples = synthetic.generate(self.kind, tokenizer, self.context_length, self.num_samples, self.seed)
        return [
            Prompt(
                id=sample.id,
                messages=[{"role": "user", "content": sample.prompt}],
                target=list(sample.targets),
                metadata={"depth": sample.depth, "kind": sample.kind},
            )
            for sample in samples
        ]

    def score(self, prompt: Prompt, output: str) -> dict[str, float]:
        return {"score": synthetic.score(output, prompt.target, synthetic.SCORE_MODES[self.kind])}


def load_task(cfg: Mapping[str, Any], seed: int) -> EvalTask:
    """Build the task named by the ``task`` config group."""
    family = cfg.get("family")
    if family == "synthetic":
        return SyntheticTask(
            name=cfg["name"],
            kind=cfg["kind"],
            context_length=cfg["context_length"],
            num_samples=max(cfg["num_samples"], cfg.get("limit") or 0),
            seed=seed,
            max_new_tokens=cfg["max_new_tokens"],
        )
    raise SnapevalError(f"unknown task family {family!r}; choose one of synthetic", "task.family")
