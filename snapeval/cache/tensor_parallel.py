"""The engine under tensor parallel: a model split across ranks by transformers' TP plan gives each rank's
attention its own share of the heads, and the engine selects, rings and evicts on those; what is decided
across heads (speculative prefill's token importance) is averaged over the ranks here, so that every rank
takes the decision the one-device model takes; how many query heads a rank's attention computes is read
off the model (:func:`query_heads_here`: a family's plan splits them or keeps them whole).

MLA (DeepSeek-V3/R1) is the whole-attention case by construction: its plan splits the MLPs and experts
alone (:func:`snapeval.models.parallel.check_tensor_parallel` refuses one that splits attention), so every
rank holds the whole latent, computes every head and selects the same slots as one device does
(:func:`replicated_attention`). Which world a run has is :mod:`snapeval.models.parallel`'s.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache


def tp_degree(model: Any) -> int:
    """The number of ranks ``model``'s weights are split across (1 for a model on one device)."""
    return int(getattr(model, "_tp_size", None) or getattr(model, "tp_size", None) or 1)


def replicated_attention(model: Any) -> bool:
    """Whether every rank of ``model`` holds its whole attention, cache and heads: an MLA model, whose
    latent no plan run here splits. (Other families that keep heads whole, Phi-3's and GPT-OSS's, are read
    off the model by :func:`query_heads_here`.)"""
    return bool(getattr(model.config.get_text_config(), "kv_lora_rank", None))


def mean_over_ranks(tensor: Any, model: Any) -> Any:
    """``tensor`` (a mean over this rank's heads of ``model``) averaged over the ranks ``model`` is split
    across: the mean over all its heads, every rank holding as many. ``tensor`` itself where the model is
    on one device, or holds every head on every rank (:func:`replicated_attention`: each rank's mean is
    already all heads'). A decision taken from it (which tokens speculative prefill keeps) is then the
    same on every rank, as the one-device model's."""
    size = tp_degree(model)
    if size == 1 or replicated_attention(model):
        return tensor
    total = tensor.contiguous().clone()
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM, group=tp_group(model))
    return total / size


def whole_kv_bytes(share: int, heads_here: int, model: Any) -> int:
    """The KV bytes of a row on one device, of which this rank holds ``share`` over its ``heads_here`` KV
    heads: ``share`` times the model's KV heads over those (every head holds as many bytes). A family whose
    plan splits the KV heads (Llama: k/v colwise) holds 1/TP of them on each rank, so this is every rank's
    share summed; one that keeps them whole on every rank (Phi-3, GPT-OSS) holds the whole row on each, and
    this is ``share`` itself, as on one device (a sum over the ranks would count it TP times); so does
    an MLA model, whose one latent head every rank holds whole (:func:`replicated_attention`)."""
    if replicated_attention(model):
        return share
    config = model.config.get_text_config()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return share * heads // heads_here


def tp_group(model: Any) -> Any:
    """The process group of the ranks ``model`` is split across: its device mesh's ``tp`` dimension
    (transformers 5.17 on: a (pp, fsdp, tp) mesh), its one dimension (before), else the default group."""
    mesh = getattr(model, "_device_mesh", None)
    if mesh is None:
        return None
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if "tp" in names:
        return mesh["tp"].get_group()
    return mesh.get_group() if mesh.ndim == 1 else None


def query_heads_here(model: Any, keyword: str) -> int | None:
    """The query heads each attention module of a model split across ranks computes on this rank (None on
    one device: the config's): its cached KV heads, read off a one-token forward (the cache passed as
    ``keyword``), times the GQA group. A family's TP plan splits heads (Llama: q/k/v colwise) or keeps
    them whole on every rank (Phi-3's gathered qkv_proj; GPT-OSS, which splits its experts alone), so the
    config and the degree do not tell. An MLA model computes every head on every rank
    (:func:`replicated_attention`; its one cached latent head says nothing of its query heads)."""
    if tp_degree(model) == 1:
        return None
    config = model.config.get_text_config()
    if replicated_attention(model):
        return config.num_attention_heads
    heads = config.num_attention_heads
    probe = DynamicCache(config=model.config)
    with torch.no_grad():
        ids = torch.zeros(1, 1, dtype=torch.long, device=model.device)
        model(input_ids=ids, **{keyword: probe})
    return probe.layers[0].keys.shape[1] * (heads // (getattr(config, "num_key_value_heads", None) or heads))
