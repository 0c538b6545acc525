"""Parameter count of a decoder-only transformer, estimated from its config.

Counts the embeddings, attention (standard/GQA or DeepSeek MLA), gated MLPs (gate, up and down
projections) or mixture-of-experts layers, RMSNorm weights, and the LM head unless it is tied to the
embeddings. Biases are counted only where ``attention_bias`` says so; the DeepSeek multi-token
prediction module is not counted (it is not used for decoding). :func:`parameter_groups` gives the same
count by what a tensor-parallel plan splits or leaves whole (:mod:`snapeval.memory.sharding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapeval.memory.config_fields import head_dim, optional_int, require_int

GATED_MLP_MATRICES = 3
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")


GROUPS = ("embeddings", "lm_head", "attention", "mlp", "experts", "shared_experts", "routers", "norms")
"""The parts of a model a TP plan splits or keeps whole, as :func:`parameter_groups` counts them."""


def estimate_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of the model ``config`` describes."""
    return sum(parameter_groups(config).values())


def parameter_groups(config: Mapping[str, Any]) -> dict[str, int]:
    """Parameters of the model ``config`` describes, by :data:`GROUPS`: the input embeddings, the LM head
    (none when tied to them), attention, dense MLPs, routed experts, shared experts, routers and norms
    (of every layer)."""
    hidden = require_int(config, "hidden_size")
    layers = require_int(config, "num_hidden_layers")
    vocab = require_int(config, "vocab_size")
    tied = config.get("tie_word_embeddings", False)
    return {
        "embeddings": vocab * hidden,
        "lm_head": 0 if tied else vocab * hidden,
        "attention": layers * attention_parameters(config),
        **mlp_groups(config),
        "norms": (2 * layers + 1) * hidden,
    }


def attention_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of one attention block."""
    if optional_int(config, "kv_lora_rank"):
        return mla_parameters(config)
    hidden = require_int(config, "hidden_size")
    heads = require_int(config, "num_attention_heads")
    kv_heads = optional_int(config, "num_key_value_heads") or heads
    q_width, kv_width = heads * head_dim(config), kv_heads * head_dim(config)
    weights = hidden * (q_width + 2 * kv_width) + q_width * hidden
    biases = q_width + 2 * kv_width + hidden if config.get("attention_bias", False) else 0
    return weights + biases


def mla_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of one multi-head latent attention block (DeepSeek-V2/V3), norms included."""
    hidden = require_int(config, "hidden_size")
    heads = require_int(config, "num_attention_heads")
    kv_rank = require_int(config, "kv_lora_rank")
    nope = require_int(config, "qk_nope_head_dim")
    rope = require_int(config, "qk_rope_head_dim")
    v_dim = require_int(config, "v_head_dim")
    q_rank = optional_int(config, "q_lora_rank")
    q_out = heads * (nope + rope)
    query = hidden * q_rank + q_rank + q_rank * q_out if q_rank else hidden * q_out
    key_value = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
    return query + key_value + heads * v_dim * hidden


def mlp_groups(config: Mapping[str, Any]) -> dict[str, int]:
    """Parameters of the MLPs of all layers: dense ones (``mlp``), and in the layers of a mixture of
    experts its routed ``experts``, ``shared_experts`` and ``routers``."""
    hidden = require_int(config, "hidden_size")
    layers = require_int(config, "num_hidden_layers")
    dense_mlp = GATED_MLP_MATRICES * hidden * require_int(config, "intermediate_size")
    experts = next(filter(None, (optional_int(config, key) for key in EXPERT_COUNT_KEYS)), None)
    if experts is None:
        return {"mlp": layers * dense_mlp, "experts": 0, "shared_experts": 0, "routers": 0}
    expert_size = optional_int(config, "moe_intermediate_size") or require_int(config, "intermediate_size")
    shared_size = optional_int(config, "shared_expert_intermediate_size") or (
        (optional_int(config, "n_shared_experts") or 0) * expert_size
    )
    dense_layers = min(optional_int(config, "first_k_dense_replace") or 0, layers)
    moe_layers = layers - dense_layers
    return {
        "mlp": dense_layers * dense_mlp,
        "experts": moe_layers * GATED_MLP_MATRICES * hidden * experts * expert_size,
        "shared_experts": moe_layers * GATED_MLP_MATRICES * hidden * shared_size,
        "routers": moe_layers * hidden * experts,
    }
