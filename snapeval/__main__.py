"""``python -m snapeval [overrides]``: the Hydra front door. Thin: check the config, call the runner,
print its table (:func:`format_summary`).

A wrong group option (``task=nope``) or field (``seed=abc``, ``+cache.budgt=5``), or a database that
cannot be used (``db.url``), is refused in one line with exit code 2 before torch and transformers load
(:mod:`snapeval.schema`); cache parameters, data files, shards and drafts next, before any model loads
(:mod:`snapeval.preflight`). Ctrl-C or SIGTERM ends the run as ``interrupted`` (exit 130 or 143).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tabulate import tabulate

from snapeval import schema
from snapeval.config import compose_config, named_after_weights
from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR

if TYPE_CHECKING:
    from snapeval.runner import RunSummary


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    config = named_after_weights(OmegaConf.to_container(cfg, resolve=True))
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:  # the schema was checked before Hydra started (check_before_hydra), and the runner checks again
        if config["job"] == "memory":
            from snapeval.memory.point import run_memory_point

            print(run_memory_point(config))
            return
        from snapeval.runner import run

        summaries = run(config)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (snapeval.workers.Terminated)
        print(
            "interrupted: every sample stored so far is kept; the same command resumes the run",
            file=sys.stderr,
        )
        sys.exit(143 if type(exc).__name__ == "Terminated" else 130)
    except SnapevalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if multirun:
            return
        sys.exit(2)
    except Exception as exc:
        if not multirun:
            raise
        print(f"error: this point failed ({type(exc).__name__}: {exc}); the sweep goes on", file=sys.stderr)
        return
    print(format_summary(summaries))


def check_before_hydra(overrides: list[str]) -> None:
    """Compose and check a single run's config before Hydra starts it (and makes its output folder); a
    sweep (``-m``) or Hydra flags go straight to Hydra, whose runner records each bad point as failed."""
    schema.check_choices(overrides)
    if not any(o.startswith(("-", "hydra")) for o in overrides):
        config = compose_config(*overrides)
        schema.check(config)
        from snapeval.results import ResultsDB  # the database opens (or fails on db.url) in a second

        ResultsDB(config["db"]["url"]).close()
        if config["job"] == "evaluate":  # cache, task, data, shard and drafts: before any model loads
            from snapeval.preflight import check_inputs

            check_inputs(config)


def _task_label(config: Mapping[str, Any]) -> str:
    """The task's name, and the protocol preset it ran under (``+protocol=...``), if any."""
    protocol = config.get("protocol")
    return f"{config['task']['name']} ({protocol['name']})" if protocol else config["task"]["name"]


def format_summary(summaries: list[RunSummary]) -> str:
    """A table with a row per cache setting: what ran, accuracy with its 95% CI and n, KV memory, speed."""
    rows = []
    for summary in summaries:
        config, cache = summary.config, summary.config["cache"]
        setting = ", ".join(f"{k}={v}" for k, v in cache.items() if k != "method" and v is not None)
        rows.append(
            {
                "model": config["model"]["name"],
                "task": _task_label(config),
                "cache": f"{cache['method']}({setting})" if setting else cache["method"],
                "accuracy": f"{summary.accuracy:.3f}",
                "95% CI": f"[{summary.ci_low:.3f}, {summary.ci_high:.3f}]",
                **{name: f"{value:.3f}" for name, value in summary.pass_at.items()},
                "n": summary.n,
                "new": summary.computed,
                "KV MiB": f"{summary.kv_mib:.1f}",
                "prefill s": f"{summary.prefill_s:.2f}",
                "decode tok/s": f"{summary.decode_tok_s:.1f}",
            }
        )
    table = tabulate(rows, headers="keys", tablefmt="github")
    if elsewhere := sum(summary.elsewhere for summary in summaries):
        table += (
            f"\n{elsewhere} sample(s) were claimed by other workers on the same point(s): see their output"
        )
        table += ", or python -m snapeval.results summary once they finish"
    return table


if __name__ == "__main__":
    try:
        check_before_hydra(sys.argv[1:])
    except SnapevalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    main()
