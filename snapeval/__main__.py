"""``python -m snapeval [overrides]``: the Hydra front door. Thin: resolve the config, call the runner."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR
from snapeval.runner import format_summary, run


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    config = OmegaConf.to_container(cfg, resolve=True)
    try:
        if config["job"] == "memory":
            from snapeval.memory.point import run_memory_point

            print(run_memory_point(config))
            return
        if config["job"] != "evaluate":
            raise SnapevalError(f"unknown job {config['job']!r}; choose one of evaluate, memory", "job")
        summaries = run(config)
    except SnapevalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            return  # the point is recorded as failed; the sweep goes on
        sys.exit(2)
    except Exception as exc:
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            raise
        print(f"error: this point failed ({type(exc).__name__}: {exc}); the sweep goes on", file=sys.stderr)
        return
    print(format_summary(summaries))


if __name__ == "__main__":
    main()
