"""An FP8 checkpoint shaped as DeepSeek-V3/R1's release (issue 55, item 4): a tiny random DeepSeek-V3 whose
projections are stored as ``float8_e4m3fn`` with one float32 ``weight_scale_inv`` per 16 x 16 block and a
``quantization_config`` saying so, beside its float32 twin (the same blocks dequantized). On a CPU,
:func:`snapeval.models.load_model` loads it dequantized, says so (:func:`weights_path`), and answers as the
twin does, token for token, with the same logits, through a compressing cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from snapeval.cache import build_cache, install
from snapeval.couplings import MLA_LATENT_CACHE, at_least
from snapeval.decode.generation import generate
from snapeval.models import ModelSpec, load_model, model_config
from snapeval.models.weights import FP8_KERNELS, weights_path
from tests.families import FAMILIES

BLOCK = 16
VOCAB = 512
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
QUANTIZATION = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [BLOCK] * 2,
}
"""DeepSeek-V3's own ``quantization_config``, its 128 x 128 blocks made 16 x 16 for the tiny model."""

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(not at_least(MLA_LATENT_CACHE), reason="the engine serves MLA from this release"),
]


def quantized(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` (rows, columns) as FP8 blocks and their float32 inverse scales (one per block)."""
    rows, columns = weight.shape
    blocks = weight.reshape(rows // BLOCK, BLOCK, columns // BLOCK, BLOCK)
    scales = blocks.abs().amax(dim=(1, 3)) / FP8_MAX
    return (blocks / scales[:, None, :, None]).to(torch.float8_e4m3fn).reshape(rows, columns), scales


def dequantized(weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    rows, columns = weight.shape
    blocks = weight.float().reshape(rows // BLOCK, BLOCK, columns // BLOCK, BLOCK)
    return (blocks * scales[:, None, :, None]).reshape(rows, columns)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """``fp8``: every projection (attention, MLPs, routed and shared experts) in FP8 blocks, the embeddings,
    LM head, router and norms in float32, as the release stores them; ``twin``: the same model in
    float32, its projections the FP8 blocks dequantized; ``original``: the model before quantizing."""
    root = tmp_path_factory.mktemp("fp8")
    FAMILIES["deepseek_v3"](VOCAB).save_pretrained(root / "original")
    state = load_file(root / "original" / "model.safetensors")
    stored, twin = {}, {}
    for name, tensor in state.items():
        if name.endswith("proj.weight"):
            weight, scales = quantized(tensor)
            stored[name], stored[name.removesuffix("weight") + "weight_scale_inv"] = weight, scales
            twin[name] = dequantized(weight, scales)
        else:
            stored[name] = twin[name] = tensor
    for name, tensors in (("fp8", stored), ("twin", twin)):
        shutil.copytree(root / "original", root / name)
        save_file(tensors, root / name / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((root / "fp8" / "config.json").read_text())
    (root / "fp8" / "config.json").write_text(json.dumps({**config, "quantization_config": QUANTIZATION}))
    return {name: root / name for name in ("original", "fp8", "twin")}


def answers(folder: Path) -> tuple[str, list[int], list[torch.Tensor]]:
    """How the model in ``folder`` runs its weights, and its greedy tokens and logits under SnapStream
    (budget 48 of an 80-token prompt)."""
    spec = ModelSpec(folder.name, str(folder), dtype="float32", device="cpu")
    model = load_model(spec)
    model.generation_config.eos_token_id = None
    logits = []
    model.register_forward_hook(lambda module, args, output: logits.append(output.logits[0, -1].clone()))
    prompt = torch.randint(3, VOCAB, (80,), generator=torch.Generator().manual_seed(1)).tolist()
    cache = build_cache({"method": "snapstream", "budget": 48, "window": 8, "sinks": 4, "ring": 8})
    tokens = generate(install(model), prompt, cache, 12, set()).tokens
    return weights_path(model, model_config(spec)), tokens, logits


def test_an_fp8_checkpoint_loads_dequantized_on_cpu_and_answers_as_its_float32_twin(folders):
    path, tokens, logits = answers(folders["fp8"])
    twin_path, twin_tokens, twin_logits = answers(folders["twin"])
    assert (path, twin_path) == ("fp8 dequantized to float32", "float32")
    assert tokens == twin_tokens and len(logits) == len(twin_logits) == 12
    assert max((a - b).abs().max().item() for a, b in zip(logits, twin_logits, strict=True)) <= 1e-5
    _, original_tokens, original_logits = answers(folders["original"])  # FP8 blocks are not the original
    assert max((a - b).abs().max().item() for a, b in zip(logits, original_logits, strict=True)) > 1e-4


def test_weights_kept_in_fp8_are_the_kernels_path(folders):
    spec = ModelSpec("fp8", str(folders["fp8"]), dtype="float32", device="cpu")
    model = load_model(spec)
    model.model.layers[0].self_attn.q_a_proj.weight.data = torch.zeros(1, dtype=torch.float8_e4m3fn)
    assert weights_path(model, model_config(spec)) == FP8_KERNELS
