"""The root of the config tree (``conf/config.yaml`` extends :class:`Config`) and its own groups: how a run
executes (``run``, never part of a result's identity) and how answers are drawn (``generation``)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from snapeval.configs.engine import EngineConfig
from snapeval.configs.fields import (
    MAX_LEASE_S,
    Checked,
    boolean,
    choice,
    integer,
    number,
    setting,
    shard,
    text,
)
from snapeval.configs.methods import METHODS, parameter_names
from snapeval.configs.model import ModelConfig
from snapeval.configs.task import SCHEMAS, TaskConfig
from snapeval.errors import SnapevalError
from snapeval.stats import STAGE_CONFIDENCE, samples_needed

DEFAULT_DB = "results/snapeval.sqlite"
"""Where results go unless ``run.db`` (or ``$SNAPEVAL_DB``) says otherwise."""
DB_ENV_VAR = "SNAPEVAL_DB"
"""The results database of every command when none is named on its command line."""
DB_DEFAULT = f"${{oc.env:{DB_ENV_VAR},{DEFAULT_DB}}}"
"""``run.db``'s default: resolved when a config is composed, so one variable means one database for
``python -m snapeval`` and the reading commands alike. Precedence: ``run.db=...`` (``--db`` for the
reading commands) on the command line, then ``$SNAPEVAL_DB``, then :data:`DEFAULT_DB`."""
RENDEZVOUS_S = 300
"""How long the ranks of a tensor-parallel launch wait to meet, unless ``run.rendezvous_s`` says."""
MAX_DRAWS = 10_000
"""The most answers drawn per prompt (``generation.num_samples``); a run's requests (prompts x draws) are
capped too (:data:`MAX_REQUESTS`): each is a stored sample, set up before the first is evaluated."""
MAX_REQUESTS = 1_000_000
"""The most requests (prompts x draws) one run makes."""
COMPILE_MODES = ("auto", "on", "off", "graphs")
"""``run.compile``: compiled with CUDA graphs on a GPU and eager on CPU, always compiled, never, or the
eager step captured as CUDA graphs (a GPU only; no compile wait)."""
DECODE_ATTENTIONS = ("auto", "grouped", "split")
"""``run.decode_attention``: split-KV on a GPU and grouped SDPA on CPU, or either everywhere."""


def budgeted_method(value: Any) -> str | None:
    """A built-in method that takes a budget."""
    names = [name for name, params in METHODS.items() if "budget" in parameter_names(params)]
    return None if value in names else "one of " + ", ".join(names)


@dataclass
class RunConfig(Checked):
    """How a run executes: which samples, how many rows decode together, where results go. Every path
    gives the same answers, so none of it is hashed, and only the shard a worker ran is stored (the runs
    table shows it)."""

    path = "run"

    limit: int | None = setting(
        None, check=integer(optional=True), stored=False, help="the first N samples (null: all)"
    )
    shard: str | None = setting(None, check=shard, help="i/n: the i-th of n slices")
    batch_size: int = setting(8, check=integer(), stored=False, help="rows decoding together")
    compile: str = setting(
        "auto", check=choice(*COMPILE_MODES), stored=False, help="the compiled decode step"
    )
    decode_attention: str = setting(
        "auto", check=choice(*DECODE_ATTENTIONS), stored=False, help="one decode token's attention kernel"
    )
    progress: bool = setting(True, check=boolean, stored=False, help="a progress bar over samples")
    db: str = setting(
        DB_DEFAULT,
        check=text,
        stored=False,
        help=f"a path (SQLite) or any SQLAlchemy URL; else ${DB_ENV_VAR}, else {DEFAULT_DB}",
    )
    lease_s: int = setting(
        120,
        check=integer(low=4, high=MAX_LEASE_S),
        stored=False,
        help="a dead worker's claims expire after this",
    )
    rendezvous_s: int = setting(
        RENDEZVOUS_S,
        check=integer(high=MAX_LEASE_S),
        stored=False,
        help="how long the ranks of a tensor-parallel launch wait to meet",
    )


@dataclass
class GenerationConfig(Checked):
    """How answers are drawn (their length is ``task.max_new_tokens``)."""

    path = "generation"

    do_sample: bool = setting(False, check=boolean, help="false: greedy")
    temperature: float = setting(1.0, check=number(0, 100, low_open=True))
    top_p: float = setting(1.0, check=number(0, 1, low_open=True))
    num_samples: int = setting(1, check=integer(high=MAX_DRAWS), help="answers drawn per prompt")


@dataclass
class ProtocolConfig(Checked):
    """A protocol preset (``+protocol=NAME``): the official run of its task(s), and what it does otherwise."""

    path = "protocol"

    name: str = setting(check=text)
    task: Any = setting(help="the task it belongs to, or a list of them")
    deviations: list[str] = setting([], help="README 'Protocols' rows this preset does otherwise")


@dataclass
class SearchConfig(Checked):
    """A budget search (``job=search``, ``+exp=budget_search``; :mod:`snapeval.commands.search`): the
    smallest budget at which ``method`` keeps ``target`` of the full cache's accuracy."""

    path = "search"

    method: str = setting("snapstream", check=budgeted_method, help="a method that takes a budget")
    target: float = setting(0.95, check=number(0, 1, low_open=True), help="retention to keep")
    budgets: list[int] = setting([128, 256, 512, 1024], help="the coarse ladder, evaluated first")
    resolution: int = setting(
        32, check=integer(), help="the grid between the ladder's budgets, tested at last"
    )
    min_samples: int = setting(
        10, check=integer(), help="samples per budget at first, at least what the target needs"
    )
    max_samples: int = setting(
        100, check=integer(high=MAX_REQUESTS), help="at most, per budget: a pass needs them all"
    )
    params: dict[str, Any] = setting({}, help="the method's other parameters, fixed")
    compare: bool = setting(False, check=boolean, help="also the exhaustive grid, and the samples ratio")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.budgets or not all(
            isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in self.budgets
        ):
            raise SnapevalError(
                f"must be a non-empty list of positive integers, got {self.budgets!r}", "search.budgets"
            )
        if self.min_samples > self.max_samples:
            message = f"must be at most search.max_samples = {self.max_samples}, got {self.min_samples}"
            raise SnapevalError(message, "search.min_samples")
        needed = samples_needed(self.target, STAGE_CONFIDENCE)
        if self.max_samples < needed:
            message = (
                f"{self.max_samples} samples cannot show {self.target:g} retention: a search needs "
                f">= {needed:g} the full cache gets right, with no loss ({STAGE_CONFIDENCE:.1%} a stage)"
            )
            raise SnapevalError(message, "search.max_samples")


@dataclass
class Config(Checked):
    """The whole config of ``python -m snapeval``."""

    job: str = setting("evaluate", check=choice("evaluate", "memory", "search"), stored=False)
    seed: int = setting(0, check=integer(low=0))
    run: RunConfig = setting(RunConfig, hashed=False)
    engine: EngineConfig = setting(EngineConfig, stored=False, help="a server started per setting")
    generation: GenerationConfig = setting(GenerationConfig)
    task: TaskConfig = setting(MISSING)
    model: ModelConfig = setting(MISSING)
    cache: Any = setting(MISSING, help="a cache method's parameters (snapeval/configs/cache.py)")
    grid: Any = setting(None, stored=False, help="cache settings from one prefill (each point is stored)")
    memory: Any = setting(None, stored=False, help="the memory estimator's settings (job=memory)")
    search: SearchConfig | None = setting(None, stored=False, help="a budget search's settings (job=search)")
    protocol: ProtocolConfig | None = setting(None, when_set=True)
    hardware: Any = setting(None, when_set=True, help="a conf/hardware entry (+hardware=NAME)")


def declared_fields(schema: type = Config, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """Every field of the config tree by dotted path (those of every kind of task), nested ones after
    their node."""
    hints = typing.get_type_hints(schema)
    seen: set[str] = set()
    for item in dataclasses.fields(schema):
        path = f"{prefix}{item.name}"
        yield path, item
        declared = hints[item.name]
        nodes = [arg for arg in typing.get_args(declared) if dataclasses.is_dataclass(arg)] or [declared]
        for node in filter(dataclasses.is_dataclass, nodes):
            for kind in [node, *(kind for kind in SCHEMAS.values() if issubclass(kind, node))]:
                for child in declared_fields(kind, f"{path}."):
                    if child[0] not in seen:
                        seen.add(child[0])
                        yield child


def declared_default(path: str) -> Any:
    """The default of the config field at dotted ``path`` (``run.batch_size``), as declared."""
    return next(item.default for name, item in declared_fields() if name == path)
