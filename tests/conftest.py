"""Shared fixtures: the embedded model, loaded once per test session, and composed configs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from snapeval.cache import install
from snapeval.models import ModelSpec, load_model, load_tokenizer
from snapeval.paths import CONF_DIR


def compose_config(*overrides: str) -> dict:
    """The resolved config that ``python -m snapeval <overrides>`` would run, as a plain dict."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


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
