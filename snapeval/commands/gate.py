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

A gate of ``kind: engine`` (:mod:`snapeval.commands.engine_gate`) judges a deployed engine's setting
against snapeval's reference of the same setting from the stored runs alone, and runs nothing; the gates
above are ``kind: retention``, the default.

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
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from snapeval.cli import one_line_errors
from snapeval.commands.engine_gate import ENGINE, EngineGate, EngineVerdict, judge_engine
from snapeval.commands.gate_spec import (
    check_counts,
    check_entry,
    check_overrides,
    check_sides,
    gate_config,
    located,
    one_setting,
    stored_samples,
)
from snapeval.configs.check import check
from snapeval.errors import SnapevalError
from snapeval.results import ResultsDB, database_url
from snapeval.results.options import DB_OPTION, add_db_option, open_existing
from snapeval.run.plan import Inputs, RunPlan, check_inputs, make_plan
from snapeval.stats import CONFIDENCE, Retention, retention

RETENTION = "retention"
FIELDS = ("name", "task", "cache", "min_retained", "min_n")


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
        name, task, cache, min_retained, min_n = check_entry(spec, FIELDS, where)
        for key, overrides in (("task", task), ("cache", cache)):
            check_overrides(overrides, f"{where}.{key}")
        check_sides(task, cache, where)
        check_counts(min_retained, min_n, where)
        return cls(name, tuple(task), tuple(cache), float(min_retained), min_n)

    def configs(self, db_url: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The full-cache and the compressed run configs, storing their samples at ``db_url``."""
        full, compressed = (gate_config(overrides, db_url) for overrides in self.overrides())
        return full, compressed

    def overrides(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The overrides of the full-cache and of the compressed run."""
        return (*self.task, "cache=full"), (*self.task, *self.cache)


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


def load_gates(path: str | Path) -> list[Gate | EngineGate]:
    """The gates of a YAML spec file: a list of :class:`Gate` entries (``kind: retention``, the default)
    and :class:`~snapeval.commands.engine_gate.EngineGate` ones (``kind: engine``)."""
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
    return [_gate(entry, f"{path}[{index}]") for index, entry in enumerate(spec)]


def _gate(entry: object, where: str) -> Gate | EngineGate:
    kind = entry.get("kind", RETENTION) if isinstance(entry, Mapping) else RETENTION
    if kind == ENGINE:
        return EngineGate.from_spec(entry, where)
    if kind != RETENTION:
        raise SnapevalError(f"must be {RETENTION} (the default) or {ENGINE}, got {kind!r}", f"{where}.kind")
    if isinstance(entry, Mapping):
        entry = {key: value for key, value in entry.items() if key != "kind"}
    return Gate.from_spec(entry, where)


def checked_configs(
    gates: list[Gate | EngineGate], spec: Path, db_url: str, runs: bool
) -> dict[str, Inputs | None]:
    """Each retention gate's full-cache and compressed config by where it comes from in ``spec``
    (``<spec>[i].task`` or ``.cache``), checked before torch loads: its fields, and when the gates
    ``runs``, its inputs (:func:`snapeval.run.plan.check_inputs`: task, data, shard, drafts' names), which
    it maps to; an engine gate's configs checked alone (it runs nothing). A bad one is refused in one line
    naming both."""
    checked = {}
    for index, gate in enumerate(gates):
        if isinstance(gate, EngineGate):
            gate.check(f"{spec}[{index}]", db_url)
            continue
        for key, overrides in zip(("task", "cache"), gate.overrides(), strict=True):
            where = f"{spec}[{index}].{key}"
            with located(where):
                config = gate_config(overrides, db_url)
                one_setting(config, key)
                checked[where] = check_inputs(config) if runs else check(config)
    return checked


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


def judge(gate: Gate | EngineGate, db: ResultsDB) -> Verdict | EngineVerdict:
    """The gate's verdict on the samples stored under both of its configs (an engine gate's, under its
    four: :func:`~snapeval.commands.engine_gate.judge_engine`)."""
    if isinstance(gate, EngineGate):
        return judge_engine(gate, db)
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
    return {row["sample_id"]: row["score"] for row in stored_samples(db, config) if row["score"] is not None}


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
            if isinstance(gate, Gate):
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
