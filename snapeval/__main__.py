"""``python -m snapeval [overrides]``: the Hydra front door. Thin: check the config, call the runner,
print its table (:func:`snapeval.tables.run_table`).

A wrong group option (``task=nope``) or field (``seed=abc``, ``+cache.budgt=5``), or a database that
cannot be used (``run.db``), is refused in one line with exit code 2 before torch and transformers load
(:mod:`snapeval.configs.check`); cache parameters, data files, shards and drafts next, before any model loads
(:mod:`snapeval.preflight`). Ctrl-C or SIGTERM ends the run as ``interrupted`` (exit 130 or 143).
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from snapeval.cli import keep_interrupts, report
from snapeval.configs import legacy
from snapeval.configs.check import check_choices, validate
from snapeval.configs.compose import plain
from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    config = plain(cfg)
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:  # the schema was checked before Hydra started (check_before_hydra), and the runner checks again
        if config["job"] == "memory":
            from snapeval.memory.point import run_memory_point

            print(run_memory_point(config))
            return
        from snapeval.runner import run
        from snapeval.tables import run_table

        summaries = run(config)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (snapeval.workers.Terminated)
        sys.exit(interrupted(exc))
    except SnapevalError as exc:
        code = report(exc)
        if multirun:
            return
        sys.exit(code)
    except Exception as exc:
        if not multirun:
            raise
        print(f"error: this point failed ({type(exc).__name__}: {exc}); the sweep goes on", file=sys.stderr)
        return
    print(run_table(summaries))


def check_before_hydra(overrides: list[str]) -> None:
    """Compose and check a single run's config before Hydra starts it (and makes its output folder), its
    Hydra settings (``hydra.job.name=x``) left to Hydra; a sweep (``-m``) or Hydra flags go to Hydra once
    every override parses and names existing options: its runner records each bad point as failed."""
    check_choices(overrides)
    if any(o.startswith("-") for o in overrides):
        return
    config = validate([o for o in overrides if not is_hydra_setting(o)])
    from snapeval.results import ResultsDB  # the database opens (or fails on run.db) in a second

    ResultsDB(config["run"]["db"]).close()
    if config["job"] == "evaluate":  # cache, task, data, shard and drafts: before any model loads
        from snapeval.preflight import check_inputs

        check_inputs(config)


def is_hydra_setting(override: str) -> bool:
    """Whether ``override`` sets Hydra's own config (``hydra.job.name=x``, ``hydra/launcher=joblib``)."""
    key = override.lstrip("+~").partition("=")[0]
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def interrupted(exc: KeyboardInterrupt) -> int:
    """Say in one line that the command was interrupted; its exit code: 143 for SIGTERM
    (:class:`snapeval.workers.Terminated`), else 130 (Ctrl-C)."""
    print(
        "interrupted: every sample stored so far is kept; the same command resumes the run",
        file=sys.stderr,
    )
    return 143 if type(exc).__name__ == "Terminated" else 130


if __name__ == "__main__":
    try:  # Ctrl-C while torch loads (or anywhere before the run) ends in one line too
        sys.argv[1:] = legacy.rewrite(sys.argv[1:])  # old spellings (task.limit=2), each with a note
        try:
            with keep_interrupts():
                check_before_hydra(sys.argv[1:])
        except SnapevalError as exc:
            sys.exit(report(exc))
        main()
    except KeyboardInterrupt as exc:
        sys.exit(interrupted(exc))
