"""What a benchmark declares once, and what the runner asks of it.

A benchmark is one module of :mod:`snapeval.tasks` holding one :class:`Task` subclass: where its rows
come from, how a row becomes chat messages, how an output is scored, and the switches its protocol
offers (``options``). Its settings (generation length, truncation, query split, option defaults) are its
Hydra config, ``conf/task/<name>.yaml``; the lm-eval task definitions under ``lm_eval_tasks/`` are
generated from both (:mod:`snapeval.tasks.lm_eval_export`). Tasks know nothing of caches.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from transformers import PreTrainedTokenizerBase

from snapeval.errors import SnapevalError

THINK_END = "</think>"
ANSWER_FROM = ("response", "after_reasoning")


def after_reasoning(text: str) -> str:
    """The final answer part of a reasoning model's output: the text after its last ``</think>``."""
    return text.rpartition(THINK_END)[2]


def answer_part(text: str, answer_from: str) -> str:
    """Where an answer is looked for: the whole ``response``, or only the text ``after_reasoning``."""
    if answer_from == "response":
        return text
    if answer_from == "after_reasoning":
        return after_reasoning(text)
    raise ValueError(f"unknown answer_from {answer_from!r}; choose one of {', '.join(ANSWER_FROM)}")


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
        module, _, name = str(cfg["prompt"]).rpartition(".")
        try:
            build_prompt = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as exc:
            message = f"cannot import {cfg['prompt']!r} ({type(exc).__name__}: {exc})"
            raise SnapevalError(message, "task.answer_pass.prompt") from None
        if not callable(build_prompt):
            raise SnapevalError(f"{cfg['prompt']!r} is not a function", "task.answer_pass.prompt")
        max_new_tokens = cfg.get("max_new_tokens")
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise SnapevalError(
                f"must be a positive integer, got {max_new_tokens}", "task.answer_pass.max_new_tokens"
            )
        return cls(build_prompt, max_new_tokens)


class Task(ABC):
    """A benchmark, built from its task config (``conf/task/<name>.yaml``, ``seed``).

    A subclass declares the config ``names`` it serves, its ``metrics`` (the headline first), its
    ``options`` (``task.metadata`` switches and their choices, the default first), an optional
    ``system_message`` and the row field that ids a sample (``id_field``; else its index), and
    implements :meth:`rows`, :meth:`user_text` and :meth:`score_row` (and :meth:`target` if it has one).
    """

    names: ClassVar[tuple[str, ...]]
    metrics: ClassVar[tuple[str, ...]]
    options: ClassVar[dict[str, tuple[str, ...]]] = {}
    system_message: ClassVar[str | None] = None
    id_field: ClassVar[str | None] = None
    needs_tokenizer: ClassVar[bool] = False  # rows are generated with the model's tokenizer

    def __init__(self, cfg: Mapping[str, Any], seed: int = 0) -> None:
        self.config = cfg
        self.name: str = cfg["name"]
        self.seed = seed
        self.max_new_tokens: int = cfg["max_new_tokens"]
        self.truncation: str = cfg.get("truncation", "error")
        self.max_prompt_tokens: int | None = cfg.get("max_prompt_tokens")
        agnostic = cfg.get("compression") == "query_agnostic"
        self.query_start: str | None = cfg.get("query_start") if agnostic else None
        self.answer_pass = AnswerPass.from_config(cfg.get("answer_pass"))
        self.metadata: dict[str, Any] = dict(cfg.get("metadata") or {})
        for option, choices in self.options.items():
            self.metadata[option] = metadata_choice(self.metadata, option, choices, choices[0])

    @abstractmethod
    def rows(self, tokenizer: PreTrainedTokenizerBase | None) -> list[dict[str, Any]]:
        """Every row of the benchmark, in a fixed order (``tokenizer``: when :attr:`needs_tokenizer`)."""

    @abstractmethod
    def user_text(self, row: Mapping[str, Any]) -> str:
        """The user message of ``row``."""

    @abstractmethod
    def score_row(self, row: Mapping[str, Any], output: str) -> dict[str, float]:
        """The :attr:`metrics` of one output."""

    def target(self, row: Mapping[str, Any]) -> Any:
        """The reference answer stored with a sample (None where the score is not a comparison)."""
        return None

    def prompt_metadata(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """What a sample stores about its row beyond id and target."""
        return {}

    def messages(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        user = [{"role": "user", "content": self.user_text(row)}]
        return [{"role": "system", "content": self.system_message}, *user] if self.system_message else user

    def prompts(self, tokenizer: PreTrainedTokenizerBase) -> list[Prompt]:
        """Every sample of the task, in a fixed order."""
        return [
            Prompt(
                id=str(row[self.id_field]) if self.id_field else str(index),
                messages=self.messages(row),
                target=self.target(row),
                metadata=self.prompt_metadata(row),
                doc=row,
            )
            for index, row in enumerate(self.rows(tokenizer))
        ]

    def score(self, prompt: Prompt, output: str) -> dict[str, float]:
        """The metrics of one output, with ``score``, the headline metric in [0, 1]."""
        metrics = self.score_row(prompt.doc, output)
        return {"score": float(metrics[self.metrics[0]]), **{k: float(v) for k, v in metrics.items()}}


def metadata_choice(metadata: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    """A task option given in its metadata (``task.metadata.<key>``, or lm-eval's ``--metadata``)."""
    value = metadata.get(key) or default
    if value not in choices:
        message = f"unknown value {value!r}; choose one of {', '.join(choices)}"
        raise SnapevalError(message, f"task.metadata.{key}")
    return value
