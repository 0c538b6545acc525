"""Composing a run's config: what a user's overrides mean before anything runs."""

from __future__ import annotations

from pathlib import Path

from snapeval.config import compose_config


def test_other_weights_are_named_after_them_not_after_the_default_entry(tmp_path: Path) -> None:
    """``model.pretrained=<folder>`` over the default ``smollm2-135m`` runs other weights: their rows must
    not be stored (and shown, and compared) under the embedded model's name and Hub id."""
    folder = tmp_path / "random-deepseek"
    folder.mkdir()
    model = compose_config(f"model.pretrained={folder}")["model"]
    assert (model["name"], model["hub_id"]) == ("random-deepseek", None)
    hub = compose_config("model.pretrained=Qwen/Qwen2.5-0.5B-Instruct")["model"]
    assert hub["name"] == "Qwen/Qwen2.5-0.5B-Instruct"
    named = compose_config(f"model.pretrained={folder}", "model.name=mine")["model"]
    assert named["name"] == "mine"
    default = compose_config()["model"]
    assert (default["name"], default["hub_id"]) == ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert compose_config("model=qwen3-8b")["model"]["name"] == "qwen3-8b"
