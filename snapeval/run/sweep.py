"""Hydra callback for sweeps: a line per point as it starts, and one summary table at the end.

The summary reads the results database only: one row per point of this multirun (accuracy, 95% CI, n,
KV MiB, seconds per sample, status), failed points included with their error.
"""

from __future__ import annotations

import itertools
import sys
from datetime import datetime, timezone
from typing import Any

import pandas as pd
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from snapeval.cli import EXIT_BAD_INPUT, report
from snapeval.cli.world import writing_rank
from snapeval.configs.backend import quote_arguments
from snapeval.errors import SnapevalError
from snapeval.results import ResultsDB, summary_of
from snapeval.results.options import open_existing
from snapeval.results.tables import SWEEP_COLUMNS, cache_label, numbers, render, task_label


class SweepSummary(Callback):
    """Prints progress through a multirun and, at its end, the table of every point."""

    def __init__(self) -> None:
        self.started = datetime.now(timezone.utc)
        self.points = 0
        self.total: int | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = datetime.now(timezone.utc)
        self.total = count_points(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN or not writing_rank():
            return
        self.points += 1
        overrides = " ".join(config.hydra.overrides.task)
        of_total = f"/{self.total}" if self.total else ""
        print(f"[sweep] point {self.points}{of_total}: {overrides}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Print the table of the sweep's points; end the command with exit code 2 when no evaluation point
        finished (every one failed, or none could store a run): the errors are above."""
        evaluates = config.get("job") == "evaluate"
        if not writing_rank():  # rank 0 alone reads the database and prints the table
            return
        try:
            with open_existing(config.run.db, field="run.db") as db:
                table = sweep_table(db, self.started)
        except SnapevalError as error:  # no point could open the database: each said why
            report(error)
            table = pd.DataFrame()
        failed = 0 if table.empty else int((table["status"] == "failed").sum())
        if not table.empty:
            print(render(table))
            print(f"[sweep] {len(table)} points, {failed} failed" + (" (errors above)" if failed else ""))
        if evaluates and (table.empty or not (table["status"] == "finished").any()):
            print(f"error: sweep: no point finished ({failed} failed; errors above)", file=sys.stderr)
            raise SystemExit(EXIT_BAD_INPUT)  # Hydra turns a callback's Exception into a warning


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper expands them: for every key its last override wins,
    a sweep (``a,b``, ``range(...)``) gives one value per job, and the jobs are the product over keys."""
    per_key: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(quote_arguments(overrides)):
        if override.is_sweep_override():
            key = override.get_key_element()
            per_key[override.key_or_group] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            per_key[override.key_or_group] = [override.input_line]
    return [list(job) for job in itertools.product(*per_key.values())]


def count_points(config: DictConfig) -> int | None:
    """Points of a basic-sweeper multirun: its ``params`` then the command line (None if it cannot tell)."""
    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    params = config.hydra.sweeper.get("params") or {}
    overrides = [f"{key}={value}" for key, value in params.items()] + list(config.hydra.overrides.task)
    try:
        return len(sweep_points(overrides))
    except Exception:  # e.g. a glob over config group options, which only the sweeper can expand
        return None


def sweep_table(db: ResultsDB, since: datetime) -> pd.DataFrame:
    """One row per config run since ``since``: its setting, accuracy with CI, memory, speed, status."""
    latest = {run["config_hash"]: run for run in db.runs_since(since)}  # a point swept twice is one row
    rows = []
    for run in latest.values():
        samples = db.samples_for(run["config_hash"])
        seconds = sum(s["prefill_s"] + s["decode_s"] for s in samples) / len(samples) if samples else None
        rows.append(
            {
                "task": task_label(run["config"]),
                "cache": cache_label(run["config"]["cache"]),
                **numbers({**summary_of(samples), "s_per_sample": seconds}, SWEEP_COLUMNS),
                "status": run["status"],
                "error": (run["error"] or "")[:80],
            }
        )
    return pd.DataFrame(rows)
