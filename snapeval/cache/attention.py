"""The attention function that lets a snapeval cache see queries and own the attention mask.

transformers calls ``past_key_values.update(k, v, layer_idx)`` and then the layer's attention function,
in that order, for every layer, but does not give the attention function the cache. :func:`install`
wraps each attention module's ``forward`` so that the ``past_key_values`` it receives also reaches the
attention function (as the ``snapeval_cache`` keyword, through transformers' attention kwargs): no state
outside the call, so two models or two threads never see each other's cache, and ``torch.compile``
traces it as plain arguments. When that cache is a snapeval cache, the attention function registered
here as ``"snapeval"``

* at prefill, runs ordinary SDPA with the model's causal/padding mask, and afterwards gives the cache the
  layer's post-RoPE queries so it can score and compress that layer at once;
* at decode, replaces the model's mask by the cache's own: which slots are valid and causally visible.
  A compressed cache holds tokens out of order, so only the cache knows that mask. The cache may also
  transform the keys attended to (:meth:`~snapeval.cache.base.SnapevalCache.attention_keys`).

With any other cache (or none) it is exactly transformers' SDPA. :func:`install` switches a model to it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from snapeval.cache.base import SnapevalCache
from snapeval.errors import SnapevalError

ATTENTION_NAME = "snapeval"
ROPE_INV_FREQ = "snapeval_rope_inv_freq"  # attribute that install() sets on every attention module
CACHE_KWARG = "snapeval_cache"  # the keyword that carries a layer's past_key_values to the attention
ROTARY_MODULE = "snapeval_rotary_emb"  # the model's rotary embedding module, kept on every attention module
INPUTS_KWARG = "snapeval_inputs"  # and the module's forward inputs, for a cache that wants_layer_inputs


def snapeval_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """SDPA whose mask and prefill side effects come from the layer's snapeval cache, if it has one.

    ``dropout`` may come positionally (kvpress wraps every registered attention function that way)."""
    kwargs["dropout"] = dropout
    layer_idx = module.layer_idx
    cache = kwargs.pop(CACHE_KWARG, None)
    inputs = kwargs.pop(INPUTS_KWARG, None)
    if not isinstance(cache, SnapevalCache):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if cache.awaiting_prefill(layer_idx):
        output = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        scaling = kwargs.get("scaling") or module.scaling
        valid = _valid_columns(attention_mask, key)
        cache.finish_prefill(layer_idx, query, valid, scaling, module, inputs)
        return output
    mask = cache.attention_mask(layer_idx, query.shape[2], query.shape[1])
    key = cache.attention_keys(layer_idx, key, module)
    kwargs["is_causal"] = False
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def _valid_columns(attention_mask: torch.Tensor | None, key: torch.Tensor) -> torch.Tensor:
    """(batch, kv_len) bool: which prompt columns are real tokens, read off the last query's mask row.

    With left padding the last prompt token is always real, so its row shows exactly the non-pad columns.
    """
    batch, _, kv_len, _ = key.shape
    if attention_mask is None:
        return torch.ones(batch, kv_len, dtype=torch.bool, device=key.device)
    row = attention_mask[:, 0, -1, :kv_len]
    row = row if row.dtype == torch.bool else row == 0
    return row.expand(batch, kv_len)


def _rope_inv_freq(model: PreTrainedModel) -> torch.Tensor | None:
    """The model's RoPE inverse frequencies (float32), or None where the engine cannot read them.

    Unreadable: no ``rotary_emb.inv_freq`` on the decoder (e.g. per-layer-type RoPE), or frequencies that
    change with the sequence length (dynamic NTK, LongRoPE). Partial rotary shows up at use, as too few
    frequencies for the head dimension.
    """
    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    inv_freq, rope_type = getattr(rotary, "inv_freq", None), getattr(rotary, "rope_type", None)
    if not isinstance(inv_freq, torch.Tensor) or rope_type in ("dynamic", "longrope"):
        return None
    return inv_freq.detach().float().clone()


def _passing_the_cache(forward: Callable) -> Callable:
    """An attention module's ``forward`` that also hands its ``past_key_values`` to the attention
    function (transformers passes the module's extra keyword arguments on to it), and, to a cache that
    ``wants_layer_inputs``, the forward's own keyword inputs (hidden states, position embeddings)."""

    @functools.wraps(forward)
    def forward_with_cache(*args, past_key_values=None, **kwargs):
        extra = {CACHE_KWARG: past_key_values}
        if getattr(past_key_values, "wants_layer_inputs", False):
            extra[INPUTS_KWARG] = dict(kwargs)
        return forward(*args, past_key_values=past_key_values, **extra, **kwargs)

    setattr(forward_with_cache, CACHE_KWARG, True)
    return forward_with_cache


def install(model: PreTrainedModel) -> PreTrainedModel:
    """Register the ``snapeval`` attention and switch ``model`` to it (a no-op for other caches); each
    attention module's ``forward`` passes its cache on (see the module docstring).

    Every attention module also gets the model's RoPE frequencies as ``ROPE_INV_FREQ`` (or None), for
    caches that re-rotate keys, and its rotary embedding module as ``ROTARY_MODULE``, for scorers that
    rotate queries of their own.
    """
    if not getattr(model, "_supports_attention_backend", False):
        raise SnapevalError(
            f"{type(model).__name__} does not route attention through transformers' attention interface, "
            "so the KV-cache engine cannot drive it; use a model such as Llama, Qwen2 or Mistral",
            "model",
        )
    if getattr(model.config, "sliding_window", None) and getattr(model.config, "use_sliding_window", True):
        layer_types = getattr(model.config, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types):
            raise SnapevalError("models with sliding-window attention layers are not supported yet", "model")
    inv_freq = _rope_inv_freq(model)
    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    for module in model.modules():
        if hasattr(module, "layer_idx"):
            setattr(module, ROPE_INV_FREQ, inv_freq)
            vars(module)[ROTARY_MODULE] = rotary  # a plain reference, not a registered submodule
            if not getattr(module.forward, CACHE_KWARG, False):
                module.forward = _passing_the_cache(module.forward)
    AttentionInterface.register(ATTENTION_NAME, snapeval_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return model
