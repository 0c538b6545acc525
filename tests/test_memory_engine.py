"""The memory estimator's bytes equal the engine's cache tensors, for every attention family.

Tiny random-weight models built from transformers config classes (2-4 layers, hidden <= 256) with each
family's cache-shaping features on: GQA, qkv bias, a sliding window on every layer (Mistral), sliding and
global layers (Gemma 3, GPT-OSS), and MLA with DeepSeek-R1's latent widths. The estimator reads each
model's saved ``config.json`` (the local-config path, as a user would), and is compared with the tensors
:class:`~snapeval.cache.slots.SlotCache` allocates and with what a prefilled cache holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    Gemma3TextConfig,
    GptOssConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)

from snapeval.cache import build_cache, install
from snapeval.cache.slots import SlotCache
from snapeval.couplings import MLA_LATENT_CACHE, at_least
from snapeval.memory import estimate, kv_bytes_per_sequence, kv_bytes_per_token, load_geometry

WINDOW = 16  # every windowed family's sliding window: shorter than PROMPT and CAPACITY
PROMPT = 192  # tokens prefilled
CAPACITY = 64  # slots of a SlotCache row
BUDGET = 128  # SnapStream's budget (its other parameters the defaults): above WINDOW, below PROMPT
VOCAB = 512
COMMON = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": VOCAB}
GQA = {**COMMON, "num_attention_heads": 4, "num_key_value_heads": 2}
SLIDING, FULL = "sliding_attention", "full_attention"
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}
R1_LATENT = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}

FAMILIES: dict[str, tuple[PretrainedConfig, torch.dtype]] = {
    "llama": (LlamaConfig(**GQA), torch.float32),
    "qwen2": (Qwen2Config(**GQA), torch.float32),  # q/k/v biases
    "mistral_window": (MistralConfig(**GQA, sliding_window=WINDOW), torch.float32),  # every layer slides
    "gemma3": (
        Gemma3TextConfig(
            **{**GQA, "num_hidden_layers": 4},
            head_dim=16,
            sliding_window=WINDOW,
            layer_types=[SLIDING, SLIDING, FULL, SLIDING],
        ),
        torch.float32,
    ),
    "gpt_oss": (
        GptOssConfig(
            **GQA,
            head_dim=16,
            sliding_window=WINDOW,
            layer_types=[SLIDING, FULL],
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        torch.float32,
    ),
    # DeepSeek-R1's attention widths (one 576-wide latent per token and layer) on 2 layers, in bf16
    "deepseek_v3": (
        DeepseekV3Config(
            **{**COMMON, "hidden_size": 128},
            num_attention_heads=2,
            num_key_value_heads=2,
            q_lora_rank=64,
            **R1_LATENT,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
        ),
        torch.bfloat16,
    ),
}


METHODS = {"full": {"method": "full"}, "snapstream": {"method": "snapstream", "budget": BUDGET}}


def family_model(name: str, folder: Path) -> tuple[PreTrainedModel, str]:
    """The family's random-weight model, its config saved into ``folder``, and its KV dtype name."""
    config, dtype = FAMILIES[name]
    if config.model_type == "deepseek_v3" and not at_least(MLA_LATENT_CACHE):
        pytest.skip(f"transformers < {MLA_LATENT_CACHE} caches MLA per head; the engine refuses it there")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(dtype).eval()
    model.config.save_pretrained(folder)
    return model, DTYPE_NAMES[dtype]


def layer_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


@pytest.mark.parametrize("family", FAMILIES)
def test_bytes_per_token_equal_a_slot_of_the_engine(family, tmp_path):
    model, kv_dtype = family_model(family, tmp_path)
    slots = SlotCache.for_model(model, rows=1, capacity=CAPACITY)
    slot = layer_bytes([tensor[0, :, :1] for tensor in [*slots.keys, *slots.values]])  # in every layer
    assert slot == slots.shapes.kv_bytes(1) == kv_bytes_per_token(load_geometry(str(tmp_path)), kv_dtype)


def test_the_mla_slot_is_r1s_70272_bytes_over_61_layers(tmp_path):
    model, _ = family_model("deepseek_v3", tmp_path)
    per_layer = SlotCache.for_model(model, rows=1, capacity=CAPACITY).shapes.kv_bytes(1) // 2
    assert per_layer == (512 + 64) * 2
    assert 61 * per_layer == kv_bytes_per_token(load_geometry("deepseek-r1"), "bf16") == 70_272


@pytest.mark.parametrize("family", FAMILIES)
def test_a_slot_row_holds_what_the_estimate_says(family, tmp_path):
    model, kv_dtype = family_model(family, tmp_path)
    slots = SlotCache.for_model(model, rows=1, capacity=CAPACITY)
    held = layer_bytes([*slots.keys, *slots.values])
    assert held == kv_bytes_per_sequence(load_geometry(str(tmp_path)), CAPACITY, kv_dtype)


@pytest.mark.parametrize(("method", "family"), [(m, f) for m in METHODS for f in FAMILIES])
def test_a_prefilled_cache_holds_what_the_estimate_says(method, family, tmp_path):
    model, kv_dtype = family_model(family, tmp_path)
    install(model)
    cache = build_cache(METHODS[method])
    ids = torch.randint(3, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(input_ids=ids, past_key_values=cache)
    expected = estimate(str(tmp_path), "h100", context=PROMPT, **METHODS[method], kv_dtype=kv_dtype)
    assert cache.kv_bytes() == expected.kv_bytes_per_sequence_compressed
