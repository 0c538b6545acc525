"""What a benchmark declares once, and what the runner asks of it.

A benchmark is one module of :mod:`snapeval.tasks` holding one :class:`Task` subclass: where its rows
come from, how a row becomes chat messages, how an output is scored. Its settings (generation length,
truncation, query split, the switches its protocol offers and their choices) are declared by its schema
(:mod:`snapeval.configs.task`) and set by its Hydra config, ``conf/task/<name>.yaml``; the lm-eval task
definitions under the top-level ``tasks/`` are generated from both (:mod:`snapeval.tasks.lm_eval_export`).
Tasks know nothing of caches.

Rows come from a local file or folder, ``$SNAPEVAL_DATA_DIR`` or the Hugging Face Hub
(:func:`~snapeval.tasks.rows.load_rows`).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from snapeval.configs.task import ANSWER_FROM, task_defaults, task_options
from snapeval.errors import SnapevalError
from snapeval.tasks.hub import DATA_PATH_FIELD, DataSource
from snapeval.tasks.rows import load_rows, short_repr

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

THINK_END = "</think>"
RAW_ROLE = "raw"
"""The role of a message that is the whole prompt text, special tokens included, which the model reads as
it is (no chat template): a prompt an official harness writes out in full (LiveCodeBench's styles)."""
MAX_CHARS_PER_TOKEN = 256
"""A bound on the characters one token holds, for refusing a row too long for the window before
tokenizing it: SmolLM2's longest token has 81; byte-level BPE vocabularies keep theirs far below 256."""


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
    followups: tuple[str, ...] = ()  # the user texts of the turns after the first, on the same context

    @property
    def turns(self) -> int:
        """How many questions the sample asks of its context, one per turn."""
        return 1 + len(self.followups)


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

    A subclass declares the config ``names`` it serves, its ``metrics`` (the headline first), an optional
    ``system_message`` and the row field that ids a sample (``id_field``; else its index), and
    implements :meth:`rows`, :meth:`user_text` and :meth:`score_row` (and :meth:`target` if it has one).
    A task read from data declares its ``source`` and reads it with :meth:`data_rows`, which refuses a
    row :meth:`row_problem` finds unfit; ``deviations`` names the README "Protocols" deviations its
    scoring has under any preset (stored with every row it scores).
    """

    names: ClassVar[tuple[str, ...]]
    metrics: ClassVar[tuple[str, ...]]
    system_message: ClassVar[str | None] = None
    reads_as_text: ClassVar[bool] = False
    """Whether its prompts read as plain text for a base model (``model.completion``): a prompt that ends
    where the answer begins, needing no chat turn."""
    id_field: ClassVar[str | None] = None
    needs_tokenizer: ClassVar[bool] = False  # rows are generated with the model's tokenizer
    multi_turn: ClassVar[bool] = False  # several questions of one context (followups): no lm-eval definition
    source: ClassVar[DataSource | None] = None
    deviations: tuple[str, ...] = ()

    def __init__(self, cfg: Mapping[str, Any], seed: int = 0, limit: int | None = None) -> None:
        defaults = task_defaults(cfg["name"])
        given = {key: value for key, value in (cfg.get("metadata") or {}).items() if value is not None}
        cfg = {**defaults, **cfg, "metadata": {**defaults.get("metadata", {}), **given}}
        self.config = cfg
        self.name: str = cfg["name"]
        self.seed = seed
        self.limit = limit
        self.max_new_tokens: int = cfg["max_new_tokens"]
        self.truncation: str = cfg.get("truncation", "error")
        self.max_prompt_tokens: int | None = cfg.get("max_prompt_tokens")
        agnostic = cfg.get("compression") == "query_agnostic"
        self.query_start: str | None = cfg.get("query_start") if agnostic else None
        self.answer_pass = AnswerPass.from_config(cfg.get("answer_pass"))
        self.metadata: dict[str, Any] = dict(cfg.get("metadata") or {})
        for option, choices in task_options(self.name).items():
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

    def data_rows(self, source: DataSource | None = None) -> list[dict[str, Any]]:
        """The rows of ``source`` (by default :attr:`source`), each with its id once and fit to score."""
        source = source or self.source
        if source is None:
            raise TypeError(f"{type(self).__name__} declares no data source")
        return load_rows(source, self.metadata.get("data_path"), self.id_field, self.row_problem)

    def row_problem(self, row: Mapping[str, Any]) -> str | None:
        """What makes ``row`` unfit for this task, naming its field (None: fine)."""
        return None

    def check_fits(self, rows: Sequence[Mapping[str, Any]], window: int) -> None:
        """Refuse a prompt with more characters than the tokens ``window`` leaves it can hold
        (:data:`MAX_CHARS_PER_TOKEN` each), before any tokenizer reads it, where it would be refused."""
        room = window - self.max_new_tokens
        if self.truncation == "middle" or self.max_prompt_tokens or self.needs_tokenizer or room <= 0:
            return
        for index, row in enumerate(rows, start=1):
            chars = sum(len(message["content"]) for message in self.messages(row))
            if chars > room * MAX_CHARS_PER_TOKEN:
                row_id = f" ({self.id_field} {short_repr(row.get(self.id_field))})" if self.id_field else ""
                left = f"model.max_context {window} - task.max_new_tokens {self.max_new_tokens}"
                raise SnapevalError(
                    f"row {index}{row_id}: its prompt has {chars:,} characters, more than the {room:,} "
                    f"tokens of {left} hold ({MAX_CHARS_PER_TOKEN} a token at most); shorten it or set "
                    "task.truncation=middle",
                    DATA_PATH_FIELD,
                )

    def prompt_metadata(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """What a sample stores about its row beyond id and target."""
        return {}

    def messages(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        user = [{"role": "user", "content": self.user_text(row)}]
        return [{"role": "system", "content": self.system_message}, *user] if self.system_message else user

    def prompts(self, tokenizer: PreTrainedTokenizerBase) -> list[Prompt]:
        """The task's samples in a fixed order, the first :attr:`limit` of them."""
        return [
            Prompt(
                id=str(row[self.id_field]) if self.id_field else str(index),
                messages=self.messages(row),
                target=self.target(row),
                metadata=self.prompt_metadata(row),
                doc=row,
                followups=self.followups(row),
            )
            for index, row in enumerate(self.rows(tokenizer)[: self.limit])
        ]

    def followups(self, row: Mapping[str, Any]) -> tuple[str, ...]:
        """The user texts of the turns after the first, asked of the same context in order, each after the
        answers before it (none: a one-turn task)."""
        return ()

    def score_turn(self, row: Mapping[str, Any], turn: int, output: str) -> dict[str, float]:
        """The :attr:`metrics` of the answer to turn ``turn`` (0: the first question)."""
        return self.score_row(row, output)

    def score(self, prompt: Prompt, output: str) -> dict[str, float]:
        """The metrics of one output, with ``score``, the headline metric in [0, 1]."""
        metrics = self.score_row(prompt.doc, output)
        return {"score": float(metrics[self.metrics[0]]), **{k: float(v) for k, v in metrics.items()}}

    def score_turns(self, prompt: Prompt, outputs: Sequence[str]) -> dict[str, float]:
        """The metrics of a sample's answers, one per turn: a one-turn sample's :meth:`score`; for several
        turns the headline metric of each (``turn_1``, ``turn_2``, ...) and their mean as ``score``."""
        if len(outputs) != prompt.turns:
            raise ValueError(f"sample {prompt.id} asks {prompt.turns} questions, got {len(outputs)} answers")
        if prompt.turns == 1:
            return self.score(prompt, outputs[0])
        headline = self.metrics[0]
        per_turn = {
            f"turn_{turn + 1}": float(self.score_turn(prompt.doc, turn, output)[headline])
            for turn, output in enumerate(outputs)
        }
        return {"score": sum(per_turn.values()) / len(per_turn), **per_turn}


def metadata_choice(metadata: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    """A task option given in its metadata (``task.metadata.<key>``, or lm-eval's ``--metadata``)."""
    value = metadata.get(key) or default
    if value not in choices:
        message = f"unknown value {value!r}; choose one of {', '.join(choices)}"
        raise SnapevalError(message, f"task.metadata.{key}")
    return value
