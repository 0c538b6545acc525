"""``python -m snapeval [overrides]``: the front door. Thin: compose the config once, check it into a run
plan (:mod:`snapeval.commands.evaluate`, shared with :func:`snapeval.evaluate`), hand it to the runner,
print its table (:func:`snapeval.results.tables.run_table`); Hydra starts
only a sweep (``-m``), whose jobs each compose their own point.

A wrong group option (``task=nope``) or field (``seed=abc``, ``+cache.budgt=5``), a database that cannot
be used (``run.db``), a data file, shard or draft name is refused in one line with exit code 2 before
torch and transformers load; cache parameters, drafts' and the model's configs next, before any model
loads (:mod:`snapeval.run.plan`). A sweep (``-m``) checks each of its points in its own job. Ctrl-C or
SIGTERM ends the run as ``interrupted`` (exit 130 or 143). ``--nproc N`` runs it tensor parallel on N
processes of this machine (:mod:`snapeval.cli.launch`), reported as one command.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from snapeval.cli import EXIT_BAD_INPUT, error_line, keep_interrupts, report
from snapeval.cli.launch import launch, split_nproc
from snapeval.cli.world import writing_rank
from snapeval.commands.evaluate import Checked, check_job, composed_job
from snapeval.configs import legacy
from snapeval.configs.backend import quote_arguments
from snapeval.configs.check import check_choices
from snapeval.configs.compose import plain
from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR
from snapeval.run.plan import RunPlan

SILENT_HYDRA = ("hydra/hydra_logging=disabled", "hydra/job_logging=disabled")
"""What a rank other than 0 runs Hydra with: rank 0 alone says what a sweep launches, and keeps its
record (``hydra.sweep.dir``)."""


def main(checked: Checked | None = None) -> None:
    """Run a ``checked`` single job on its config as composed (Hydra is not started: a single run makes
    no folder and composes nothing again); without one, start Hydra: a sweep (``-m``), each of whose jobs
    composes and checks its own point, or Hydra's flags (``--cfg job``, ``--help``)."""
    if checked is not None:
        if code := run_job(checked.config, checked.plan, multirun=False):
            from snapeval.results.created import remove_unused

            remove_unused(checked.created)
            sys.exit(code)
        return

    models: dict[Any, Any] = {}  # by spec: loaded once for all of a sweep's jobs (one process)

    @hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
    def job(cfg: DictConfig) -> None:
        if code := run_job(plain(cfg), None, HydraConfig.get().mode == RunMode.MULTIRUN, models):
            sys.exit(code)

    if writing_rank():
        job()
        return
    with tempfile.TemporaryDirectory(prefix="snapeval-rank-") as folder:  # its sweep record, dropped
        sys.argv += [*SILENT_HYDRA, f"hydra.sweep.dir={folder}"]
        job()


def run_job(
    config: dict[str, Any], plan: RunPlan | None, multirun: bool, models: dict[Any, Any] | None = None
) -> int:
    """Run one job (an evaluation from its ``plan`` if it has one, a memory point or a budget search) and
    print its table; its exit code. In a sweep (``multirun``) a failed point is said in one line and the
    sweep goes on. ``models``: the sweep's loaded models by spec
    (:class:`snapeval.run.evaluation.Loaded`), kept from job to job."""
    try:
        if config["job"] == "memory":
            from snapeval.memory.point import run_memory_point

            print(run_memory_point(config))
            return 0
        if config["job"] == "search":
            from snapeval.commands.search import run_search

            print(run_search(config))
            return 0
        from snapeval.results.tables import run_table
        from snapeval.run.runner import execute, run

        summaries = execute(plan) if plan is not None else run(config, models=models)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (snapeval.run.signals.Terminated)
        return interrupted(exc)
    except SnapevalError as exc:
        code = report(exc)
        return 0 if multirun else code
    except Exception as exc:
        from snapeval.models.parallel import lost_peer

        if (lost := lost_peer(exc)) is not None:  # under torchrun: no barrier with a peer gone
            print(error_line(lost), file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        if not multirun:
            raise
        print(f"error: this point failed ({type(exc).__name__}: {exc}); the sweep goes on", file=sys.stderr)
        return 0
    if writing_rank():  # under torchrun, rank 0 alone
        print(run_table(summaries))
    return 0


def check_before_hydra(overrides: list[str]) -> Checked | None:
    """A single job, composed once and checked (an evaluation into its run plan) before it starts
    (:mod:`snapeval.commands.evaluate`, the path :func:`snapeval.evaluate` takes too); its Hydra settings
    (``hydra.job.name=x``) have nothing to set without Hydra. None for a sweep (``-m``) or Hydra flags,
    and for an experiment that sweeps, which go to Hydra once every override parses and names existing
    options (each job checks its point). A search's every budget is checked here."""
    if any(o.startswith("-") for o in overrides):
        check_choices(overrides)
        return None
    return check_job(*composed_job(overrides))


def interrupted(exc: KeyboardInterrupt) -> int:
    """Say in one line that the command was interrupted; its exit code: 143 for SIGTERM
    (:class:`snapeval.run.signals.Terminated`), else 130 (Ctrl-C)."""
    print(
        "interrupted: every sample stored so far is kept; the same command resumes the run",
        file=sys.stderr,
    )
    return 143 if type(exc).__name__ == "Terminated" else 130


if __name__ == "__main__":
    try:  # Ctrl-C while torch loads (or anywhere before the run) ends in one line too
        try:
            processes, sys.argv[1:] = split_nproc(sys.argv[1:])
            if processes is not None and processes > 1:  # the ranks' own commands check the rest
                sys.exit(launch(processes, sys.argv[1:]))
        except SnapevalError as exc:
            sys.exit(report(exc))
        sys.argv[1:] = legacy.rewrite(sys.argv[1:])  # old spellings (task.limit=2), each with a note
        sys.argv[1:] = quote_arguments(sys.argv[1:])  # model.backend_args=k=v,k=v as lm-eval writes it
        try:
            with keep_interrupts():
                checked = check_before_hydra(sys.argv[1:])
        except SnapevalError as exc:
            sys.exit(report(exc))
        main(checked)
    except KeyboardInterrupt as exc:
        sys.exit(interrupted(exc))
