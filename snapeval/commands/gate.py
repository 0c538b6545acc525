"""Accuracy gates: ``snapeval gate --spec conf/gates/ci.yaml [--db URL] [--no-run]``.

A gate compares a compressed cache with the full cache on the same samples of a task. It passes when, over
at least ``min_n`` paired samples, the one-sided 95% lower bound of the retention
``acc_compressed / acc_full`` (:func:`snapeval.stats.retention`, exact for 0/1 scores) is at least
``min_retained``: the compressed cache keeps ``min_retained`` of the full accuracy with 95% confidence.
Too few samples to show that are said as such ("n = 10 cannot show 0.95 retention ...").
The spec is a YAML list of gates::

    - name: passkey-snapstream
      task: [task=ruler_passkey, task.context_length=512, run.limit=20]   # Hydra overrides
      cache: [cache=snapstream, cache.budget=256]   # overrides of cache and cache.* only
      min_retained: 0.8
      min_n: 20

A gate judges one evaluation of one compressed cache setting: a cache that is not a cache setting
(``+exp=...``, ``task.*``, a grid), a task that sets the cache or makes a grid or another job, and the
full cache as the compressed one are refused before anything runs.

Both settings are first planned (:func:`snapeval.run.plan.make_plan`) and executed
(:func:`snapeval.run.runner.execute`), which computes only the samples the database lacks (skipped with
``--no-run``): each gate says how many samples it runs, and each side shows a run's progress bar. Verdicts
are then judged from the database alone, on every paired sample stored for the two configs. Exit status: 0
when every gate passes, 1 when one fails, 2 on a bad spec, config or database.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from snapeval.cli import one_line_errors
from snapeval.configs import legacy
from snapeval.configs.cache import FULL
from snapeval.configs.check import check
from snapeval.configs.compose import compose_config
from snapeval.errors import SnapevalError
from snapeval.results import ResultsDB, database_url, identity
from snapeval.results.options import DB_OPTION, add_db_option, open_existing
from snapeval.run.plan import Inputs, RunPlan, check_inputs, make_plan
from snapeval.stats import CONFIDENCE, Retention, retention

CACHE_OVERRIDE = re.compile(r"(\+{1,2}|~)?cache(\.[\w.]+)?(=.*)?", flags=re.DOTALL)
"""An override of the cache (``cache=NAME``, ``cache.KEY=VALUE``, with Hydra's ``+``, ``++`` or ``~``)."""


@dataclass(frozen=True)
class Gate:
    """One accuracy requirement: a compressed cache against the full cache on one task setting."""

    name: str
    task: tuple[str, ...]
    cache: tuple[str, ...]
    min_retained: float
    min_n: int

    @classmethod
    def from_spec(cls, spec: object, where: str) -> Gate:
        """The gate described by one entry of a spec file; ``where`` locates it in error messages."""
        fields = ("name", "task", "cache", "min_retained", "min_n")
        if not isinstance(spec, Mapping) or set(spec) != set(fields):
            raise SnapevalError(f"must be a mapping with exactly the keys {', '.join(fields)}", where)
        name, task, cache, min_retained, min_n = (spec[field] for field in fields)
        if not isinstance(name, str) or not name:
            raise SnapevalError(f"must be a non-empty string, got {name!r}", f"{where}.name")
        for key, overrides in (("task", task), ("cache", cache)):
            if not isinstance(overrides, list) or not all(isinstance(item, str) for item in overrides):
                raise SnapevalError(f"must be a list of Hydra overrides, got {overrides!r}", f"{where}.{key}")
        _check_sides(task, cache, where)
        if not _finite(min_retained) or min_retained < 0:  # NaN or inf: a gate that cannot fail, or pass
            message = f"must be a number >= 0 and finite, got {min_retained!r}"
            raise SnapevalError(message, f"{where}.min_retained")
        if isinstance(min_n, bool) or not isinstance(min_n, int) or min_n < 1:
            raise SnapevalError(f"must be a positive integer, got {min_n!r}", f"{where}.min_n")
        return cls(name, tuple(task), tuple(cache), float(min_retained), min_n)

    def configs(self, db_url: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The full-cache and the compressed run configs, storing their samples at ``db_url``."""
        full, compressed = (self.config(overrides, db_url) for overrides in self.overrides())
        return full, compressed

    def overrides(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The overrides of the full-cache and of the compressed run."""
        return (*self.task, "cache=full"), (*self.task, *self.cache)

    @staticmethod
    def config(overrides: tuple[str, ...], db_url: str) -> dict[str, Any]:
        """The run config of ``overrides``, storing its samples at ``db_url``."""
        config = compose_config(*legacy.rewrite(list(overrides)))
        config["run"]["db"] = db_url
        return config


@dataclass(frozen=True)
class Verdict:
    """A gate judged on ``n`` paired samples: both accuracies and the retention's bounds
    (:func:`snapeval.stats.retention`)."""

    gate: Gate
    n: int
    full_accuracy: float
    compressed_accuracy: float
    bounds: Retention | None

    @property
    def passed(self) -> bool:
        return self.n >= self.gate.min_n and self.bounds is not None and self.verdict == "pass"

    @property
    def verdict(self) -> str:
        return self.bounds.verdict(self.gate.min_retained) if self.bounds else "too few"

    def report(self) -> str:
        """A few readable lines: the verdict, the accuracies, the bounds and the sample count."""
        gate = self.gate
        head = f"{'PASS' if self.passed else 'FAIL'} {gate.name}"
        if self.bounds is None:
            return f"{head}: no sample is stored for both the full and the compressed cache"
        bounds = self.bounds
        shortfall = bounds.shortfall(gate.min_retained)
        lines = [
            f"{head}: retained {bounds.ratio:.3f} of the full accuracy (required {gate.min_retained:g})",
            f"    accuracy: full {self.full_accuracy:.3f}, compressed {self.compressed_accuracy:.3f} "
            f"({' '.join(gate.cache)})",
            f"    {CONFIDENCE:.0%} bounds of the retention: [{bounds.lower:.3f}, {bounds.upper:.3f}] "
            f"(the lower one required >= {gate.min_retained:g}): {self.verdict}",
            f"    paired samples: {self.n} (required >= {gate.min_n})",
        ]
        if shortfall:
            lines.append(f"    undecided: {shortfall}")
        return "\n".join(lines)


def _finite(value: object) -> bool:
    """A real number, neither NaN nor infinite (YAML's ``.nan``, ``.inf``), nor a boolean."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def load_gates(path: str | Path) -> list[Gate]:
    """The gates of a YAML spec file (a list of :class:`Gate` entries)."""
    try:
        spec = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SnapevalError(f"cannot read the gate spec: {exc.strerror}", str(path)) from exc
    except UnicodeDecodeError as exc:
        byte = f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
        raise SnapevalError(f"{path}: not UTF-8 text ({byte}): give a YAML gate spec", "--spec") from None
    except (yaml.YAMLError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise SnapevalError(f"not valid YAML: {' '.join(str(exc).split())}", str(path)) from exc
    if not isinstance(spec, list) or not spec:
        raise SnapevalError("must be a non-empty list of gates", str(path))
    return [Gate.from_spec(entry, f"{path}[{index}]") for index, entry in enumerate(spec)]


def _check_sides(task: list[str], cache: list[str], where: str) -> None:
    """The compressed side sets the cache and nothing else; the task, which the full cache runs too,
    never sets it."""
    if not cache:
        message = "must set the compressed cache (cache=NAME, cache.KEY=VALUE), got []"
        raise SnapevalError(message, f"{where}.cache")
    for override in cache:
        if not CACHE_OVERRIDE.fullmatch(override):
            message = (
                f"{override!r} is not a cache setting: give cache=NAME and cache.KEY=VALUE overrides only"
            )
            raise SnapevalError(message, f"{where}.cache")
    for override in task:
        if CACHE_OVERRIDE.fullmatch(override):
            message = (
                f"{override!r} sets the cache, which the full-cache run would take too: give it in cache"
            )
            raise SnapevalError(message, f"{where}.task")


def one_setting(config: Mapping[str, Any], side: str) -> None:
    """Refuse a gate's config that is not one evaluation of one cache setting, and a compressed side
    (``side`` ``cache``) that is the full cache."""
    if config["job"] != "evaluate":
        raise SnapevalError(f"a gate runs two evaluations, not job={config['job']}", "job")
    if config.get("grid") is not None:
        raise SnapevalError("a gate runs one cache setting, not a grid: give each point its own gate", "grid")
    if side == "cache" and config["cache"].get("method") == FULL:
        raise SnapevalError(
            "must be a compressed cache, got full: a gate compares one with it", "cache.method"
        )


def checked_configs(gates: list[Gate], spec: Path, db_url: str, runs: bool) -> dict[str, Inputs | None]:
    """Each gate's full-cache and compressed config by where it comes from in ``spec`` (``<spec>[i].task``
    or ``.cache``), checked before torch loads: its fields, and when the gates ``runs``, its inputs
    (:func:`snapeval.run.plan.check_inputs`: task, data, shard, drafts' names), which it maps to. A bad one
    is refused in one line naming both."""
    checked = {}
    for index, gate in enumerate(gates):
        for key, overrides in zip(("task", "cache"), gate.overrides(), strict=True):
            where = f"{spec}[{index}].{key}"
            with located(where):
                config = gate.config(overrides, db_url)
                one_setting(config, key)
                checked[where] = check_inputs(config) if runs else check(config)
    return checked


@contextmanager
def located(where: str) -> Iterator[None]:
    """Re-raise a :class:`SnapevalError` with ``where`` (a gate's entry in its spec) in front of it."""
    try:
        yield
    except SnapevalError as exc:
        raise SnapevalError(str(exc), where) from None


def run_gate(gate: Gate, plans: list[RunPlan], samples: int) -> None:
    """Run what the database lacks of the gate's full-cache and compressed plans (``samples`` each, said
    first), each model loaded once (the two sides of a gate differ in their cache)."""
    from snapeval.models import ModelSpec  # torch: only once the spec, its configs and the database are good
    from snapeval.run.evaluation import Loaded
    from snapeval.run.runner import execute

    print(
        f"{gate.name}: {samples} samples of {plans[0].config['task']['name']}, each with the full cache and "
        f"with {' '.join(gate.cache)} (those stored already are not run again)",
        flush=True,
    )
    models: dict[str, Loaded] = {}
    for plan in plans:
        start = time.perf_counter()
        model = plan.config["model"]
        loaded = models.setdefault(json.dumps(model, sort_keys=True), Loaded(ModelSpec.from_config(model)))
        [summary] = execute(plan, loaded)
        print(
            f"{gate.name}: {plan.config['cache']['method']}: {summary.n} samples, {summary.computed} "
            f"computed in {time.perf_counter() - start:.0f} s",
            flush=True,
        )


def judge(gate: Gate, db: ResultsDB) -> Verdict:
    """The gate's verdict on the samples stored under both of its configs."""
    full, compressed = (_scores(db, config) for config in gate.configs(db.url))
    paired = sorted(full.keys() & compressed.keys())
    if not paired:
        return Verdict(gate, 0, math.nan, math.nan, None)
    full_scores = np.array([full[sample_id] for sample_id in paired])
    compressed_scores = np.array([compressed[sample_id] for sample_id in paired])
    bounds = retention(compressed_scores, full_scores, CONFIDENCE)
    return Verdict(gate, len(paired), full_scores.mean(), compressed_scores.mean(), bounds)


def _scores(db: ResultsDB, config: Mapping[str, Any]) -> dict[str, float]:
    """Score per sample id of the samples stored for ``config`` (as the runner stores it)."""
    rows = db.samples_for(identity(config)[1])
    return {row["sample_id"]: row["score"] for row in rows if row["score"] is not None}


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="snapeval gate", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec", required=True, type=Path, help="YAML list of gates, e.g. conf/gates/ci.yaml"
    )
    add_db_option(parser)
    parser.add_argument("--no-run", action="store_true", help="judge the stored samples only; run nothing")
    args = parser.parse_args(argv)
    gates = load_gates(args.spec)
    db_url = database_url(args.db)
    checked = checked_configs(gates, args.spec, db_url, runs=not args.no_run)  # all, before any runs
    if not args.no_run:
        ResultsDB(db_url, field=DB_OPTION).close()  # a database that cannot be written fails here, on --db
        plans = {}
        for where, inputs in checked.items():  # torch: only once the spec and its configs are good
            with located(where):
                plans[where] = make_plan(inputs)
        for index, gate in enumerate(gates):
            sides = [f"{args.spec}[{index}].{key}" for key in ("task", "cache")]
            run_gate(gate, [plans[where] for where in sides], checked[sides[0]].samples)
    with open_existing(db_url) as db:
        verdicts = [judge(gate, db) for gate in gates]
    for verdict in verdicts:
        print(verdict.report())
    failed = sum(not verdict.passed for verdict in verdicts)
    print(f"{len(verdicts) - failed} of {len(verdicts)} gates passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
