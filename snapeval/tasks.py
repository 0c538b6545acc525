"""What the runner needs from a task: chat prompts with ids, a generation length, a scorer, and for
two-pass protocols (LongBench-v2 CoT) the second call's prompt.

Tasks know nothing of caches. :func:`load_task` turns the ``task`` config group into an :class:`EvalTask`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hydra.utils import get_method
from transformers import PreTrainedTokenizerBase

from snapeval import synthetic
from snapeval.errors import SnapevalError
from snapeval.paths import TASKS_DIR


@dataclass(frozen=True)
class Prompt:
    """One sample: a stable id, the chat messages fed to the model, the reference, and extra metadata."""

    id: str
    messages: list[dict[str, str]]
    target: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    doc: Any = field(default=None, repr=False, compare=False)  # the task's own row, never stored


@dataclass(frozen=True)
class AnswerPass:
    """The second call of a two-pass protocol: a new prompt from the task's row and the first output.

    LongBench-v2 CoT: the first call reasons over the document, the second gets the question and that
    reasoning (the document omitted) and answers; the second output is the one scored.
    """

    build_prompt: Callable[[Any, str], str]
    max_new_tokens: int

    def messages(self, prompt: Prompt, first_output: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.build_prompt(prompt.doc, first_output)}]

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> AnswerPass | None:
        """From ``task.answer_pass`` (``prompt``: a dotted function path, ``max_new_tokens``), or None."""
        if not cfg:
            return None
        try:
            build_prompt = get_method(cfg["prompt"])
        except Exception as exc:  # Hydra wraps import and attribute errors alike
            message = f"cannot import {cfg['prompt']!r}: {exc}"
            raise SnapevalError(message, "task.answer_pass.prompt") from None
        max_new_tokens = cfg.get("max_new_tokens")
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise SnapevalError(
                f"must be a positive integer, got {max_new_tokens}", "task.answer_pass.max_new_tokens"
            )
        return cls(build_prompt, max_new_tokens)


def metadata_choice(metadata: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    """A task option given in its metadata (``task.metadata.<key>``, or lm-eval's ``--metadata``)."""
    value = metadata.get(key) or default
    if value not in choices:
        raise SnapevalError(
            f"unknown value {value!r}; choose one of {', '.join(choices)}", f"task.metadata.{key}"
        )
    return value


class EvalTask(Protocol):
    name: str
    max_new_tokens: int
    truncation: str  # "error" | "middle": what to do with a prompt longer than the model's window
    max_prompt_tokens: int | None  # the protocol's own budget for the prompt text (LongBench-v2: 120,000)
    query_start: str | None  # text where the query begins, for query-agnostic compression
    answer_pass: AnswerPass | None  # a second call whose output is scored (two-pass protocols)

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
    truncation: str = "error"
    max_prompt_tokens: int | None = None
    query_start: str | None = None
    answer_pass: AnswerPass | None = None

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


@dataclass
class LmEvalTask:
    """A task defined for lm-eval under ``tasks/`` (YAML + utils), run by snapeval's own runner.

    Prompts come from the task's ``doc_to_text`` (its ``description`` as the system message), scores
    from its ``process_results``; ``score`` is the first metric of its ``metric_list``.
    """

    name: str
    lm_eval_task: str
    max_new_tokens: int
    id_field: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    truncation: str = "error"
    max_prompt_tokens: int | None = None
    query_start: str | None = None
    answer_pass: AnswerPass | None = None

    def _task(self):
        from lm_eval.tasks import TaskManager

        manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=self.metadata)
        if self.lm_eval_task not in manager.all_tasks:
            raise SnapevalError(
                f"no lm-eval task {self.lm_eval_task!r} under {TASKS_DIR}; "
                f"choose one of {', '.join(manager.all_tasks)}",
                "task.lm_eval_task",
            )
        return manager.load([self.lm_eval_task])["tasks"][self.lm_eval_task]

    def prompts(self, tokenizer: PreTrainedTokenizerBase) -> list[Prompt]:
        self.task = self._task()
        system = (self.task.config.description or "").strip()
        prompts = []
        for index, doc in enumerate(self.task.eval_docs):
            messages = [{"role": "user", "content": self.task.doc_to_text(doc)}]
            if system:
                messages.insert(0, {"role": "system", "content": system})
            sample_id = str(doc[self.id_field]) if self.id_field else str(index)
            prompts.append(Prompt(sample_id, messages, self.task.doc_to_target(doc), doc=doc))
        return prompts

    def score(self, prompt: Prompt, output: str) -> dict[str, float]:
        metrics = self.task.process_results(prompt.doc, [output])
        primary = self.task.config.metric_list[0]["metric"]
        return {"score": float(metrics[primary]), **{k: float(v) for k, v in metrics.items()}}


def load_task(cfg: Mapping[str, Any], seed: int) -> EvalTask:
    """Build the task named by the ``task`` config group."""
    family = cfg.get("family")
    if family == "lm_eval":
        return LmEvalTask(
            name=cfg["name"],
            lm_eval_task=cfg["lm_eval_task"],
            max_new_tokens=cfg["max_new_tokens"],
            id_field=cfg.get("id_field"),
            metadata={"seed": seed, **(cfg.get("metadata") or {})},
            truncation=cfg.get("truncation", "error"),
            max_prompt_tokens=cfg.get("max_prompt_tokens"),
            query_start=cfg.get("query_start") if cfg.get("compression") == "query_agnostic" else None,
            answer_pass=AnswerPass.from_config(cfg.get("answer_pass")),
        )
    if family == "synthetic":
        return SyntheticTask(
            name=cfg["name"],
            kind=cfg["kind"],
            context_length=cfg["context_length"],
            num_samples=max(cfg["num_samples"], cfg.get("limit") or 0),
            seed=seed,
            max_new_tokens=cfg["max_new_tokens"],
        )
    raise SnapevalError(f"unknown task family {family!r}; choose one of synthetic, lm_eval", "task.family")
