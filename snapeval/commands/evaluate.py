"""One job from its Hydra overrides, checked before it starts: the path that ``python -m snapeval`` and
:func:`snapeval.evaluate` share.

:func:`composed_job` composes the config once (:mod:`snapeval.configs.compose`); :func:`check_job` checks it
(an evaluation into its run plan, :mod:`snapeval.run.plan`) and opens its database, all before torch
loads. The command line then runs the job and prints its table (:mod:`snapeval.__main__`);
:func:`evaluate` executes the plan with the same runner (:func:`snapeval.run.runner.execute`) and
returns the samples it stored, as ``snapeval results export`` reads them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snapeval.cli.world import writing_rank
from snapeval.configs.backend import quote_arguments
from snapeval.configs.check import check, check_choices
from snapeval.configs.compose import compose_job
from snapeval.errors import SnapevalError
from snapeval.run.plan import RunPlan, check_inputs, make_plan

if TYPE_CHECKING:
    import pandas as pd

NAMED = {
    "model": "model",
    "task": "task",
    "cache": "cache",
    "protocol": "protocol",
    "exp": "+exp",
    "db": "run.db",
}
"""The options :func:`snapeval.evaluate` takes by name, each the key of the override it stands for."""


@dataclass(frozen=True)
class Checked:
    """A single job, checked before it starts: its config, composed once, and its run plan (None for a
    memory job or a budget search, which plan their own work)."""

    config: dict[str, Any]
    plan: RunPlan | None
    created: Path | None = None  # the database file this command created: removed if it ends refused


def composed_job(overrides: Sequence[str]) -> tuple[dict[str, Any], bool]:
    """The config of ``overrides`` (a wrong group option, ``task=nope``, refused first, before Hydra parses
    anything), and whether it is a sweep (an experiment that sets Hydra's ``mode: MULTIRUN``)."""
    check_choices(list(overrides))
    return compose_job(*(o for o in overrides if not is_hydra_setting(o)))


def check_job(config: dict[str, Any], sweep: bool) -> Checked | None:
    """``config`` checked (an evaluation into its run plan) and its database opened (created if new)
    before it starts; None for a sweep, whose jobs each check their own point. A search's every budget
    is checked here."""
    evaluates = config["job"] == "evaluate"
    inputs = check_inputs(config) if evaluates else check(config)  # before torch: fields, task, data
    if config["job"] == "search":
        from snapeval.commands.search import check_search

        check_search(config)  # every budget it may try planned as it would run
    from snapeval.results import ResultsDB  # the database opens (or fails on run.db) in a second
    from snapeval.results.created import new_sqlite_file, remove_unused

    created = None
    if writing_rank():  # torchrun's other ranks open no database
        created = new_sqlite_file(config["run"]["db"])
        ResultsDB(config["run"]["db"]).close()
    if sweep:
        return None
    try:
        return Checked(config, make_plan(inputs) if evaluates else None, created)
    except BaseException:  # a refusal (or Ctrl-C) leaves no database it created
        remove_unused(created)
        raise


def is_hydra_setting(override: str) -> bool:
    """Whether ``override`` sets Hydra's own config (``hydra.job.name=x``, ``hydra/launcher=joblib``)."""
    key = override.lstrip("+~").partition("=")[0]
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def as_overrides(named: Mapping[str, Any], overrides: Sequence[str]) -> list[str]:
    """The overrides of :func:`snapeval.evaluate`'s options: each named one given (``model=...``,
    ``+exp=...``, ``run.db=...``), then ``overrides`` as given; a value of the wrong type, or a flag of
    the command line (``-m``), refused in one line naming the option."""
    if isinstance(overrides, str) or not all(isinstance(o, str) for o in overrides):
        raise SnapevalError(f"must be a list of strings like ['run.limit=2'], got {overrides!r}", "overrides")
    spelled = []
    for name, value in named.items():
        if value is None:
            continue
        value = os.fspath(value) if isinstance(value, os.PathLike) else value  # db: a path
        if not isinstance(value, str) or not value:
            raise SnapevalError(f"must be a non-empty string, got {value!r}", name)
        spelled.append(f"{NAMED[name]}={value}")
    for override in overrides:
        if override.startswith("-"):
            raise SnapevalError(f"{override} is a command-line flag; evaluate runs one job", "overrides")
    return quote_arguments([*spelled, *overrides])


def one_evaluation(config: dict[str, Any], sweep: bool) -> None:
    """Refuse a config that is not one evaluation: a memory job, a budget search, an experiment that
    sweeps (each runs with ``python -m snapeval``)."""
    if sweep:
        raise SnapevalError("this experiment sweeps: run it with python -m snapeval", "exp")
    if config["job"] != "evaluate":
        raise SnapevalError(
            f"evaluate runs evaluations; run job={config['job']} with python -m snapeval", "job"
        )


def evaluate(named: Mapping[str, Any], overrides: Sequence[str] = ()) -> pd.DataFrame:
    """Compose, check and run one evaluation as ``python -m snapeval <overrides>`` does (see
    :func:`snapeval.evaluate`); its stored samples, one row each, as :func:`snapeval.results.load` reads
    them. Every sample stored by an earlier run of the same settings is reused and returned."""
    config, sweep = composed_job(as_overrides(named, overrides))
    one_evaluation(config, sweep)
    job = check_job(config, sweep=False)
    assert job is not None and job.plan is not None  # one evaluation: never a sweep
    from snapeval.results import load
    from snapeval.results.created import remove_unused
    from snapeval.run.runner import execute

    try:
        summaries = execute(job.plan)
    except BaseException:  # a refused run leaves no database it created (one with a run stays)
        remove_unused(job.created)
        raise
    samples = load(config["run"]["db"])
    if samples.empty:
        return samples
    hashes = {summary.config_hash for summary in summaries}
    return samples[samples["config_hash"].isin(hashes)].reset_index(drop=True)
