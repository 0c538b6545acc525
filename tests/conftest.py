"""Shared fixtures: the embedded model, loaded once per test session; composing configs and sweeps."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import yaml

from snapeval import runner
from snapeval.cache import install
from snapeval.config import compose_config
from snapeval.models import ModelSpec, load_model, load_tokenizer
from snapeval.paths import CONF_DIR
from snapeval.sweep import sweep_points

# the very spec the runner builds from conf/, so that the model is loaded once per session
SMOLLM2 = ModelSpec.from_config(compose_config()["model"])


@dataclass
class LoadedModel:
    spec: ModelSpec
    tokenizer: object
    model: torch.nn.Module


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    """SmolLM2-135M-Instruct in fp32 on CPU, with the snapeval attention installed."""
    torch.manual_seed(0)
    return LoadedModel(SMOLLM2, load_tokenizer(SMOLLM2), install(load_model(SMOLLM2)))


def composed_sweep(experiment: str | None, *overrides: str) -> list[dict]:
    """Every point of a sweep (``+exp=<experiment>`` params, then ``overrides``), composed and validated
    as the runner would before loading a model; without an experiment, the one point of ``overrides``."""
    sweep = []
    if experiment:
        spec = yaml.safe_load((CONF_DIR / "exp" / f"{experiment}.yaml").read_text())
        sweep = [f"+exp={experiment}", *(f"{k}={v}" for k, v in spec["hydra"]["sweeper"]["params"].items())]
    configs = [compose_config(*point) for point in sweep_points([*sweep, *overrides])]
    for cfg in configs:
        if cfg["job"] == "evaluate":
            runner.check_config(cfg)
            runner.stored_config(cfg)  # builds the cache: rejects impossible cache parameters
    return configs
