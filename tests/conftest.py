"""Shared fixtures: the embedded model, loaded once per test session; a tiny random-weight Llama, in
memory and saved as a folder the runner loads (engine properties need no trained weights, and a forward
takes milliseconds); composing configs and sweeps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from snapeval.cache import effective_params, install
from snapeval.configs.check import check
from snapeval.configs.compose import compose_config
from snapeval.configs.grid import grid_points
from snapeval.models import ModelSpec, load_model, load_tokenizer
from snapeval.paths import CONF_DIR
from snapeval.run.sweep import sweep_points
from tests.families import FAMILIES, SMOLLM2_VOCAB

# the very spec the runner builds from conf/, so that the model is loaded once per session
SMOLLM2 = ModelSpec.from_config(compose_config()["model"])


@pytest.fixture(scope="session", autouse=True)
def load_once() -> Iterator[Callable[..., torch.nn.Module]]:
    """The session owns the models it loads: every run of a spec loaded before (its ``Loaded``) gets that
    model again, as :func:`smollm` does (the package keeps none: each run's ``Loaded`` loads its own)."""
    from snapeval.run import evaluation

    models: dict[tuple, torch.nn.Module] = {}

    def loaded(spec: ModelSpec, attn_implementation: str | None = None) -> torch.nn.Module:
        key = (spec, attn_implementation)
        if key not in models:
            models[key] = load_model(spec, attn_implementation)
        return models[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation, "load_model", loaded)
        yield loaded


@dataclass
class LoadedModel:
    spec: ModelSpec
    tokenizer: object
    model: torch.nn.Module


@pytest.fixture(scope="session")
def smollm(load_once: Callable[..., torch.nn.Module]) -> LoadedModel:
    """SmolLM2-135M-Instruct in fp32 on CPU, with the snapeval attention installed (the session's)."""
    torch.manual_seed(0)
    return LoadedModel(SMOLLM2, load_tokenizer(SMOLLM2), install(load_once(SMOLLM2)))


TINY_VOCAB = 512


@pytest.fixture(scope="session")
def tiny_llama() -> torch.nn.Module:
    """A 2-layer random-weight Llama (tests/families.py, vocabulary 512) with the snapeval attention; no
    end-of-sequence token, so that it always answers ``max_new_tokens`` tokens."""
    model = install(FAMILIES["llama"](TINY_VOCAB))
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="session")
def tiny_llama_chat() -> LoadedModel:
    """A drop-in for :func:`smollm` where no trained weights are needed: SmolLM2's tokenizer (and chat
    template) with a 2-layer random-weight Llama of its vocabulary (2 KV heads of 16 dimensions), fp32,
    with the snapeval attention. Greedy answers are random tokens, rarely the end of sequence. Its
    ``spec`` is the embedded model's, whose tokenizer it has."""
    tokenizer = load_tokenizer(SMOLLM2)
    model = FAMILIES["llama"](SMOLLM2_VOCAB)
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    return LoadedModel(SMOLLM2, tokenizer, install(model))


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama saved with SmolLM2's tokenizer: a model folder that ``model.pretrained``
    (or lm-eval's ``pretrained``) loads; prompts tokenize as on the embedded model."""
    folder = tmp_path_factory.mktemp("tiny") / "llama"
    tokenizer = load_tokenizer(SMOLLM2)  # the session's copy: converting the GGUF tokenizer takes seconds
    model = FAMILIES["llama"](SMOLLM2_VOCAB)
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_overrides(tiny_llama_folder: Path) -> tuple[str, str]:
    """Overrides that run the runner on :func:`tiny_llama_folder` (answers are random tokens)."""
    return f"model.pretrained={tiny_llama_folder}", "model.name=random-llama"


def composed_sweep(experiment: str | None, *overrides: str) -> list[dict]:
    """Every point of a sweep (``+exp=<experiment>`` Hydra params, then ``overrides``, each point's
    ``grid`` expanded), composed and validated as the runner would before loading a model; without an
    experiment, the points of ``overrides``."""
    sweep = []
    if experiment:
        spec = yaml.safe_load((CONF_DIR / "exp" / f"{experiment}.yaml").read_text())
        params = spec.get("hydra", {}).get("sweeper", {}).get("params", {})
        sweep = [f"+exp={experiment}", *(f"{k}={v}" for k, v in params.items())]
    configs = []
    for overrides_of_job in sweep_points([*sweep, *overrides]):
        cfg = compose_config(*overrides_of_job)
        if cfg["job"] != "evaluate":
            configs.append(cfg)
            continue
        check(cfg)
        for point in grid_points(cfg):
            effective_params(point["cache"])  # builds the cache: rejects impossible parameters
            configs.append(point)
    return configs


@pytest.fixture
def torch_refused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment for a subprocess in which ``import torch`` fails: a command that ends as expected
    under it did its work before torch (and transformers, which imports it) could load."""
    import os

    shadow = tmp_path_factory.mktemp("no_torch")
    (shadow / "torch").mkdir()
    (shadow / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    path = os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models on a shared CPU: one thread is ~50x faster than several fighting for two cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
