"""The ``task`` group: one schema per kind of task, extended by ``conf/task/*.yaml``.

A schema is the one declaration of a task's settings: their defaults, what each takes, and the choices of
each option (the tuples here, which the task modules import). It names the module of :mod:`snapeval.tasks`
that implements it (``module``), and :data:`SCHEMAS` is read off those names. A task config is served by
the schema and the module of its name's longest prefix before an underscore (:func:`kind_of`):
``ruler_passkey`` -> :class:`RulerTask`, ``snapeval/tasks/ruler.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

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

ANSWER_FROM = ("response", "after_reasoning")
"""Where a scorer looks for the answer: the whole output, or only the text after ``</think>``."""
AIME_SCORERS = ("qwen_math", "math_verify", "lm_eval")
"""The AIME scorers, the reference first (snapeval/tasks/aime_scorers.py: ``<name>_score`` each)."""
CODE_EXTRACTIONS = ("official", "lenient")
"""How a program is read from an answer (snapeval/tasks/livecodebench/extraction.py)."""
CHOICES = "choices"
"""The key of a field's metadata that holds an option's choices (:func:`option`)."""
TRUNCATION = choice("error", "middle")
COMPRESSION_MODES = ("query_aware", "query_agnostic")
COMPRESSION = choice(*COMPRESSION_MODES)
MAX_TURNS = 16
"""The most questions a multi-turn task asks of one context (``task.turns``)."""
MULTI_TURN = "_multiturn"
"""How the name of a multi-turn RULER kind ends (``niah_multiturn``): the kinds that take ``turns``."""
SCBENCH_SUBSETS = ("scbench_kv", "scbench_prefix_suffix", "scbench_vt", "scbench_qa_eng", "scbench_many_shot")
"""The SCBench subsets whose answers are strings a correct answer contains (snapeval/tasks/scbench.py)."""


@dataclass
class TaskConfig(Checked):
    """What every task has: its name and the one home of the answer's length."""

    path = "task"
    module: ClassVar[str] = ""
    """The module of :mod:`snapeval.tasks` that implements this kind of task ("": none of its own)."""

    name: str = setting(check=text)
    max_new_tokens: int = setting(check=integer(), help="tokens an answer may have")


def option(choices: tuple[str, ...], help: str) -> Any:
    """A ``task.metadata`` switch: one of ``choices``, the first by default (:func:`task_options`)."""
    declared = setting(choices[0], check=choice(*choices), help=help)
    return dataclasses.field(default=choices[0], metadata={**declared.metadata, CHOICES: choices})


MIN_RULER_CONTEXT = 48
"""Fewer tokens than any RULER prompt takes: its instructions, needles and question alone are 58 words or
more (passkey, the shortest), and no tokenizer shipped makes fewer tokens than words. A shorter context is
refused at once; one that is longer but still too short, once the tokenizer loads."""


def ruler_kind(value: Any) -> str | None:
    """One of the RULER kinds: a ``conf/task/ruler_<kind>.yaml`` each, as snapeval/tasks/ruler.py has them
    (``KINDS``; read off the configs, as the tasks import this module)."""
    kinds = sorted(path.stem.removeprefix("ruler_") for path in (CONF_DIR / "task").glob("ruler_*.yaml"))
    return choice(*kinds)(value)


def turn_count(value: Any) -> str | None:
    """A number of turns, in [1, :data:`MAX_TURNS`] (null: a one-turn kind's)."""
    if value is None or integer(high=MAX_TURNS)(value) is None:
        return None
    return f"an integer in [1, {MAX_TURNS}]"


@dataclass
class RulerTask(TaskConfig):
    """RULER-style prompts generated from the seed at ``context_length`` tokens (snapeval/tasks/ruler.py)."""

    module = "ruler"
    kind: str = setting(check=ruler_kind, help="the needle task: passkey, niah_single, ...")
    context_length: int = setting(1024, check=integer(low=16), help="tokens of the model's tokenizer")
    num_prompts: int = setting(
        10, check=integer(), hashed=False, help="prompts generated (prompt i is the same for any count)"
    )
    turns: int | None = setting(
        None,
        check=turn_count,
        when_set=True,
        help=f"questions asked of one context, one a turn (the *{MULTI_TURN} kinds)",
    )
    compression: str | None = setting(
        None,
        check=choice(*COMPRESSION_MODES, optional=True),
        when_set=True,
        help="query_agnostic: the (first) question after compression",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.context_length < MIN_RULER_CONTEXT:
            raise SnapevalError(
                f"context_length {self.context_length} is too small: the instructions, needles and question "
                f"alone take more than {MIN_RULER_CONTEXT} tokens",
                self.field_path("context_length"),
            )
        if self.kind.endswith(MULTI_TURN) and self.turns is None:
            message = f"kind {self.kind} asks several questions: give an integer in [1, {MAX_TURNS}]"
            raise SnapevalError(message, self.field_path("turns"))
        if not self.kind.endswith(MULTI_TURN) and self.turns is not None:
            message = f"kind {self.kind} asks one question; only the *{MULTI_TURN} kinds take turns"
            raise SnapevalError(message, self.field_path("turns"))


@dataclass
class AnswerMetadata(Checked):
    """Where a file task's rows come from and what its scorer reads."""

    path = "task.metadata"

    data_path: str | None = setting(None, check=optional_text, help="a local file instead of the Hub")
    answer_from: str = option(ANSWER_FROM, help="the whole output, or after </think>")


@dataclass
class FileTask(TaskConfig):
    """A task whose rows are read from a file or the Hub: how a long prompt is cut and compressed."""

    truncation: str = setting("error", check=TRUNCATION, help="error, or cut in the middle")
    compression: str = setting("query_aware", check=COMPRESSION, help="query_agnostic: question after")


@dataclass
class AimeTask(FileTask):
    """AIME 2024 with an official scorer (snapeval/tasks/aime24.py)."""

    module = "aime24"

    scorer: str = setting(AIME_SCORERS[0], check=choice(*AIME_SCORERS), help="the official scorer")
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

    module = "longbench_v2"
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
    code_extraction: str = option(CODE_EXTRACTIONS, help="lcb_runner's, or the last python block")


@dataclass
class LiveCodeBenchTask(FileTask):
    """LiveCodeBench code generation, graded in the sandbox (snapeval/tasks/livecodebench/)."""

    module = "livecodebench"

    prompt_style: str = setting(PROMPT_STYLES[0], check=choice(*PROMPT_STYLES))
    stop: list[str] = setting([], help="strings that end an answer")
    sandbox: dict[str, Any] = setting({}, help="SandboxLimits fields for the graded programs")
    metadata: CodeMetadata = setting(CodeMetadata)


@dataclass
class ScbenchMetadata(Checked):
    """Which SCBench subset, and where its rows come from."""

    path = "task.metadata"

    data_path: str | None = setting(None, check=optional_text, help="a local file instead of the Hub")
    subset: str = option(SCBENCH_SUBSETS, help="the SCBench subset (its Hub file data/<subset>.jsonl)")


@dataclass
class ScbenchTask(FileTask):
    """SCBench's multi-turn subsets: the questions of each row asked of its one context, turn by turn
    (snapeval/tasks/scbench.py)."""

    module = "scbench"
    metadata: ScbenchMetadata = setting(ScbenchMetadata)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compression != COMPRESSION_MODES[0]:
            message = "SCBench's questions have no fixed start to split the prompt at: only query_aware"
            raise SnapevalError(message, self.field_path("compression"))


def _descendants(schema: type[TaskConfig]) -> Iterator[type[TaskConfig]]:
    for subclass in schema.__subclasses__():
        yield subclass
        yield from _descendants(subclass)


SCHEMAS: Mapping[str, type[TaskConfig]] = MappingProxyType(
    {schema.module: schema for schema in _descendants(TaskConfig) if "module" in vars(schema)}
)
"""The schema of each task module, by the module's name (each schema's ``module``)."""


def kind_of(name: str, kinds: Iterable[str]) -> str | None:
    """The longest of ``kinds`` that task config ``name`` is, or starts with before an underscore: the
    rule by which a config finds its schema and its module."""
    prefixes = [kind for kind in kinds if f"{name}_".startswith(f"{kind}_")]
    return max(prefixes, key=len) if prefixes else None


def task_schema(name: str) -> type[TaskConfig]:
    """The schema of task config ``name`` (:data:`SCHEMAS`, by :func:`kind_of`), else :class:`TaskConfig`."""
    kind = kind_of(name, SCHEMAS)
    return SCHEMAS[kind] if kind else TaskConfig


def task_options(name: str) -> dict[str, tuple[str, ...]]:
    """The ``task.metadata`` switches of task config ``name`` and their choices, the default first: the
    fields its schema's metadata declares with :func:`option`."""
    node = next(
        (item.default_factory for item in dataclasses.fields(task_schema(name)) if item.name == "metadata"),
        None,
    )
    if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
        return {}
    return {
        item.name: item.metadata[CHOICES] for item in dataclasses.fields(node) if CHOICES in item.metadata
    }


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
