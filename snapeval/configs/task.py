"""The ``task`` group: one schema per kind of task, extended by ``conf/task/*.yaml``.

A task config is served by the schema of its name's longest prefix before an underscore, as its module
(:func:`snapeval.tasks.task_class`): ``ruler_passkey`` -> :class:`RulerTask`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from snapeval.configs.fields import (
    PROMPT_STYLES,
    Checked,
    boolean,
    choice,
    integer,
    iso_date,
    optional_text,
    setting,
    text,
)
from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR

ANSWER_FROM = choice("response", "after_reasoning")
TRUNCATION = choice("error", "middle")
COMPRESSION = choice("query_aware", "query_agnostic")


@dataclass
class TaskConfig(Checked):
    """What every task has: its name and the one home of the answer's length."""

    path = "task"

    name: str = setting(check=text)
    max_new_tokens: int = setting(check=integer(), help="tokens an answer may have")


MIN_RULER_CONTEXT = 48
"""Fewer tokens than any RULER prompt takes: its instructions, needles and question alone are 58 words or
more (passkey, the shortest), and no tokenizer shipped makes fewer tokens than words. A shorter context is
refused at once; one that is longer but still too short, once the tokenizer loads."""


def ruler_kind(value: Any) -> str | None:
    """One of the RULER kinds: a ``conf/task/ruler_<kind>.yaml`` each, as snapeval/tasks/ruler.py has them
    (``KINDS``; read off the configs, as the tasks import this module)."""
    kinds = sorted(path.stem.removeprefix("ruler_") for path in (CONF_DIR / "task").glob("ruler_*.yaml"))
    return choice(*kinds)(value)


@dataclass
class RulerTask(TaskConfig):
    """RULER-style prompts generated from the seed at ``context_length`` tokens (snapeval/tasks/ruler.py)."""

    kind: str = setting(check=ruler_kind, help="the needle task: passkey, niah_single, ...")
    context_length: int = setting(1024, check=integer(low=16), help="tokens of the model's tokenizer")
    num_prompts: int = setting(
        10, check=integer(), hashed=False, help="prompts generated (prompt i is the same for any count)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.context_length < MIN_RULER_CONTEXT:
            raise SnapevalError(
                f"context_length {self.context_length} is too small: the instructions, needles and question "
                f"alone take more than {MIN_RULER_CONTEXT} tokens",
                self.field_path("context_length"),
            )


@dataclass
class AnswerMetadata(Checked):
    """Where a file task's rows come from and what its scorer reads."""

    path = "task.metadata"

    data_path: str | None = setting(None, check=optional_text, help="a local file instead of the Hub")
    answer_from: str = setting("response", check=ANSWER_FROM, help="the whole output, or after </think>")


@dataclass
class FileTask(TaskConfig):
    """A task whose rows are read from a file or the Hub: how a long prompt is cut and compressed."""

    truncation: str = setting("error", check=TRUNCATION, help="error, or cut in the middle")
    compression: str = setting("query_aware", check=COMPRESSION, help="query_agnostic: question after")


@dataclass
class AimeTask(FileTask):
    """AIME 2024 with an official scorer (snapeval/tasks/aime24.py)."""

    scorer: str = setting("qwen_math", check=choice("qwen_math", "math_verify", "lm_eval"))
    metadata: AnswerMetadata = setting(AnswerMetadata)


@dataclass
class AnswerPassConfig(Checked):
    """The second call of a two-pass protocol: its prompt builder and length."""

    path = "task.answer_pass"

    prompt: str = setting(check=text, help="a dotted function path")
    max_new_tokens: int = setting(check=integer(), help="tokens of the answer pass")


@dataclass
class LongBenchTask(FileTask):
    """LongBench-v2 multiple choice, 0-shot or two-pass CoT (snapeval/tasks/longbench_v2.py)."""

    cot: bool = setting(False, check=boolean, help="the CoT protocol's reasoning prompt")
    max_prompt_tokens: int | None = setting(None, check=integer(optional=True))
    query_start: str | None = setting(None, check=optional_text, help="where the question starts")
    answer_pass: AnswerPassConfig | None = setting(None, when_set=True)
    metadata: AnswerMetadata = setting(AnswerMetadata)


@dataclass
class CodeMetadata(Checked):
    """Which LiveCodeBench problems, and how code is read from an answer."""

    path = "task.metadata"

    data_path: str | None = setting(None, check=optional_text)
    release: str = setting("release_v5", check=text, help="release_v1..release_v6, or vN")
    start_date: str | None = setting(None, check=iso_date)
    end_date: str | None = setting(None, check=iso_date)
    code_extraction: str = setting("official", check=choice("official", "lenient"))


@dataclass
class LiveCodeBenchTask(FileTask):
    """LiveCodeBench code generation, graded in the sandbox (snapeval/tasks/livecodebench/)."""

    prompt_style: str = setting("openai_chat", check=choice(*PROMPT_STYLES))
    stop: list[str] = setting([], help="strings that end an answer")
    sandbox: dict[str, Any] = setting({}, help="SandboxLimits fields for the graded programs")
    metadata: CodeMetadata = setting(CodeMetadata)


SCHEMAS: dict[str, type[TaskConfig]] = {
    "ruler": RulerTask,
    "aime24": AimeTask,
    "longbench_v2": LongBenchTask,
    "livecodebench": LiveCodeBenchTask,
}
"""The schema of each task module, by the module's name."""


def task_schema(name: str) -> type[TaskConfig]:
    """The schema of task config ``name``: its longest prefix before an underscore (:data:`SCHEMAS`)."""
    prefixes = [prefix for prefix in SCHEMAS if f"{name}_".startswith(f"{prefix}_")]
    return SCHEMAS[max(prefixes, key=len)] if prefixes else TaskConfig


def task_defaults(name: str) -> dict[str, Any]:
    """The defaults that task config ``name``'s schema declares, a nested node as a dict (what a task
    built from a partial config, say lm-eval's, falls back on)."""
    defaults: dict[str, Any] = {}
    for item in dataclasses.fields(task_schema(name)):
        if item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
        elif item.default is not dataclasses.MISSING:
            value = item.default
        else:
            continue
        defaults[item.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return defaults
