"""Shared fixtures: the embedded model, loaded once per test session; ``compose_config`` for tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from snapeval.cache import install
from snapeval.config import compose_config
from snapeval.models import ModelSpec, load_model, load_tokenizer

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
