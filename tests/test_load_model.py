"""``load_model`` on one device: the weights load straight onto it (``device_map``), never onto the host
first and then ``.to(device)``, and the model is the one the old path loaded (same logits), for a saved
transformers folder and for the embedded GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from snapeval.cache import install
from snapeval.models import (
    ModelSpec,
    base_attention,
    load_model,
    model_config,
    resolve_device,
    resolve_dtype,
    resolve_pretrained,
)
from snapeval.models import gguf_file as gguf_of
from tests.conftest import TINY_VOCAB, LoadedModel
from tests.families import FAMILIES

IDS = torch.tensor([[5, 17, 300, 42, 8, 99, 1, 255]])


@pytest.fixture
def tiny_folder(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    FAMILIES["llama"](TINY_VOCAB).save_pretrained(tmp_path)
    return tmp_path


def old_path(spec: ModelSpec) -> PreTrainedModel:
    """What ``load_model`` did before: the whole model onto the host, then ``.to(device)``."""
    source, device = resolve_pretrained(spec.pretrained), resolve_device(spec.device)
    config = model_config(spec)
    model = AutoModelForCausalLM.from_pretrained(
        source,
        config=config,
        gguf_file=gguf_of(spec, source),
        dtype=resolve_dtype(spec.dtype, device),
        attn_implementation=base_attention(config),
    )
    return model.to(device).eval()


@torch.inference_mode()
def test_a_single_device_run_loads_onto_the_device_without_moving_the_model(
    tiny_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = ModelSpec(name="tiny", pretrained=str(tiny_folder), dtype="float32", device="cpu")
    expected = old_path(spec)(IDS).logits
    calls: list[dict] = []
    moves: list[tuple] = []
    load = AutoModelForCausalLM.from_pretrained.__func__

    def recording(cls, *args, **kwargs):
        calls.append(kwargs)
        model = load(cls, *args, **kwargs)
        monkeypatch.setattr(model, "to", lambda *a, **k: moves.append(a) or model)  # after loading
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(recording))
    model = load_model(spec)
    assert [call.get("device_map") for call in calls] == [torch.device("cpu")]
    assert moves == [], "the loaded model was moved with .to(): its weights went through the host"
    assert {parameter.device for parameter in model.parameters()} == {torch.device("cpu")}
    assert not model.training
    assert torch.equal(model(IDS).logits, expected)


@pytest.mark.slow  # loads the embedded GGUF twice; the tiny saved model above runs by default
@torch.inference_mode()
def test_the_embedded_gguf_loads_with_a_device_map_as_it_did_without(smollm: LoadedModel) -> None:
    """The session's embedded model (``load_model``, engine installed) against the old path's."""
    old = install(old_path(smollm.spec))
    assert {parameter.device for parameter in smollm.model.parameters()} == {old.device}
    assert torch.equal(smollm.model(IDS).logits, old(IDS).logits)
