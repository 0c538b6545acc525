"""The attention function that lets a snapeval cache see queries and own the attention mask.

transformers calls ``past_key_values.update(k, v, layer_idx)`` and then the layer's attention function,
in that order, for every layer, but does not give the attention function the cache. :func:`install`
wraps each attention module's ``forward`` so that the ``past_key_values`` it receives also reaches the
attention function (as the ``snapeval_cache`` keyword, through transformers' attention kwargs): no state
outside the call, so two models or two threads never see each other's cache, and ``torch.compile``
traces it as plain arguments. When that cache is an :class:`~snapeval.cache.attended.AttendedCache` (a
:class:`~snapeval.cache.base.SnapevalCache`, or the batcher's rows,
:class:`~snapeval.decode.continuous.classes.RowClasses`, a :class:`~snapeval.cache.slots.SlotCache` per
class of rows), the attention function registered here as ``"snapeval"``

* at prefill (a :class:`~snapeval.cache.base.SnapevalCache` awaiting it), runs the model's base
  attention with the model's causal/padding (and sliding-window) mask (a later chunk of a chunked prefill:
  its cache's mask), and afterwards gives the cache the layer's post-RoPE queries so it can compress it;
* at decode, replaces the model's mask by the cache's own, in the order the
  :class:`~snapeval.cache.attended.AttendedCache` declares: which slots are valid, causally visible and,
  on a layer with a sliding window, inside it (:func:`snapeval.cache.ring.visible_slots`), per part of
  the rows (``decode_parts``: the batcher's rows attend each class over its own slots). A compressed
  cache holds tokens out of order, so only the cache knows that mask. One query token per row over SDPA
  is attended by the engine's decode attention
  (:func:`~snapeval.cache.decode_attention.grouped_decode_attention`, or the split-KV
  :func:`~snapeval.cache.decode_attention.split_decode_attention` where the cache asks for it; an MLA
  layer in latent space, :func:`~snapeval.cache.mla.absorbed_decode_attention`), anything else by the
  base attention. Afterwards the cache notes the step's query and input (``record``: a cache that evicts
  while decoding scores from them, see :mod:`snapeval.cache.eviction`).

The base attention is chosen once per model by :func:`install`: SDPA (boolean masks), or, for a model
loaded with eager attention (a family whose attention SDPA cannot express: Gemma 2's logit softcap,
GPT-OSS's attention sinks ``s_aux``), the family's own eager attention (additive float masks), which
applies the softcap and sinks itself; SDPA handed a softcap or sinks is refused in one line. With any
other cache (or none) it is exactly that base attention.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from snapeval.cache.attended import AttendedCache, DecodeCall
from snapeval.cache.base import SnapevalCache
from snapeval.cache.decode_attention import SPLIT_CHUNK, grouped_decode_attention, split_decode_attention
from snapeval.cache.method import LAYER_WINDOW
from snapeval.cache.mla import absorbed_decode_attention, is_latent, up_projections
from snapeval.cache.rope import key_rotation, rope_inv_freq
from snapeval.cache.tensor_parallel import query_heads_here
from snapeval.couplings import (
    CACHE_PARAMETERS,
    MLA_LATENT_CACHE,
    at_least,
    supported_range,
    transformers_version,
)
from snapeval.errors import SnapevalError

ATTENTION_NAME = "snapeval"
EAGER_ATTENTION_NAME = "snapeval_eager"  # the same function over a family's eager attention
BASE_ATTENTION = "snapeval_base_attention"  # attribute that install() sets: the module's base attention
ROPE_ROTATION = "snapeval_rope_rotation"  # attribute that install() sets: KeyRotation, or why there is none
SDPA_DROPS = ("softcap", "s_aux")  # attention arguments transformers' SDPA ignores: they need eager
ROPE_INV_FREQ = "snapeval_rope_inv_freq"  # attribute that install() sets on every attention module
CACHE_KWARG = "snapeval_cache"  # the keyword that carries a layer's past_key_values to the attention
ROTARY_MODULE = "snapeval_rotary_emb"  # the model's rotary embedding module, kept on every attention module
INPUTS_KWARG = "snapeval_inputs"  # and the module's forward inputs, for a cache that wants_layer_inputs
EXPAND_LATENT = "snapeval_expand_latent"  # attribute install() sets on an MLA module: its own expand_kv
UP_PROJECTIONS = "snapeval_up_projections"  # and its kv_b_proj halves, for absorbed decode attention
IN_LOOP_HOOK = "snapeval_in_loop_hook"  # attribute that install() sets once it hooked the model's forward
LOCAL_HEADS = "snapeval_local_heads"  # attribute install() sets: the query heads this rank's module computes


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
    base = getattr(module, BASE_ATTENTION, sdpa_attention_forward)
    if base is sdpa_attention_forward and any(kwargs.get(name) is not None for name in SDPA_DROPS):
        family = getattr(getattr(module, "config", None), "model_type", type(module).__name__)
        raise SnapevalError(
            f"{family}: SDPA would drop its attention {' / '.join(SDPA_DROPS)}; load it with eager attention",
            "model",
        )
    attended = isinstance(cache, AttendedCache)
    prefilling = isinstance(cache, SnapevalCache) and cache.awaiting_prefill(layer_idx)
    one_token = base is sdpa_attention_forward and _one_token_sdpa(query, kwargs)
    expand = vars(module).get(EXPAND_LATENT)  # an MLA module whose latent reaches here unexpanded
    in_latent_space = expand is not None and attended and not prefilling and one_token
    if expand is not None and (not attended or prefilling):
        key, value = expand(key, value)
    if not attended:
        return base(module, query, key, value, attention_mask, **kwargs)
    cache.note_attended(layer_idx)  # the engine is in the loop: see check_engine_in_loop
    if prefilling:
        chunk = cache.chunk_mask(layer_idx, query.shape[2], query.shape[1], kwargs.get("sliding_window"))
        if chunk is None:
            output = base(module, query, key, value, attention_mask, **kwargs)
        else:  # a later chunk of a chunked prefill: over the held slots and itself, by their columns
            output = (_decode_attention(module, base, None, query, key, value, chunk[0], kwargs), None)
        vars(module)[LAYER_WINDOW] = kwargs.get("sliding_window")  # for scores that see what it sees
        scaling = kwargs.get("scaling") or module.scaling
        valid = _valid_columns(attention_mask, key) if chunk is None else chunk[1]
        cache.finish_prefill(layer_idx, query, valid, scaling, module, inputs)
        return output
    split = cache.split_decode  # the batcher's rows on a GPU: split-KV attention
    outputs = []
    call = DecodeCall(layer_idx, key, value, query, module, kwargs.get("sliding_window"))
    for rows, part_key, part_value, mask in cache.decode_parts(call):
        if in_latent_space:
            projections = vars(module)[UP_PROJECTIONS]
            scaling = kwargs.get("scaling")
            latent = (query[rows], part_key, part_value, mask, scaling, projections)
            outputs.append(absorbed_decode_attention(*latent, SPLIT_CHUNK if split else None))
            continue
        if expand is not None:
            part_key, part_value = expand(part_key, part_value)
        one = (split_decode_attention if split else grouped_decode_attention) if one_token else None
        outputs.append(_decode_attention(module, base, one, query[rows], part_key, part_value, mask, kwargs))
    cache.record(layer_idx, query, module, inputs)  # a cache that evicts while decoding notes the step
    return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), None


def _decode_attention(
    module: torch.nn.Module,
    base: Callable,
    one_token: Callable | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """(rows, queries, heads, value_dim) decode attention of ``query`` over the held ``key``/``value``
    with the cache's ``mask``: ``one_token`` (grouped or split-KV) for one token over SDPA, else the base
    attention (an eager one with the mask as additive floats)."""
    if one_token is not None:
        return one_token(query, key, value, mask, kwargs.get("scaling"))
    kwargs = {**kwargs, "is_causal": False}
    if mask is not None and base is not sdpa_attention_forward:  # eager attention adds its mask
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(query.dtype).min
        )
    return base(module, query, key, value, mask, **kwargs)[0]


def _one_token_sdpa(query: torch.Tensor, kwargs: dict[str, Any]) -> bool:
    """Whether a decode call is plain SDPA over one query token per row (no dropout, no position bias),
    which :func:`grouped_decode_attention` computes without copying keys to every query head."""
    plain = not kwargs.get("dropout") and kwargs.get("position_bias") is None
    return plain and query.shape[2] == 1


def _valid_columns(attention_mask: torch.Tensor | None, key: torch.Tensor) -> torch.Tensor:
    """(batch, kv_len) bool: which prompt columns are real tokens, read off the mask's diagonal.

    A real token always sees itself, a padding column is hidden from every query: the diagonal tells them
    apart even on a sliding-window layer, whose last row hides real tokens outside its window.
    """
    batch, _, kv_len, _ = key.shape
    if attention_mask is None:
        return torch.ones(batch, kv_len, dtype=torch.bool, device=key.device)
    mask = attention_mask[:, 0, :, :kv_len]
    mask = mask if mask.dtype == torch.bool else mask == 0
    earlier = kv_len - mask.shape[-2]  # columns before the first query (none in a single prefill)
    diagonal = mask.diagonal(offset=earlier, dim1=-2, dim2=-1)
    return torch.cat([mask[:, -1, :earlier], diagonal], dim=-1).expand(batch, kv_len)


def cache_names(module: torch.nn.Module) -> tuple[tuple[str, ...], int | None]:
    """The names under which ``module``'s ``forward`` may be handed the cache, the one it declares first
    (then the other :data:`~snapeval.couplings.CACHE_PARAMETERS`, which a caller may still use as aliases),
    and the declared one's place among the positional parameters (None: keyword only). The declared one
    is the first of those names it takes, else a parameter annotated as a ``Cache``; a forward that takes
    none is refused in one line."""
    signature = inspect.signature(module.forward).parameters
    parameters = list(signature.values())
    found = signature.get(_known_cache_parameter(signature) or "")
    if found is None:
        found = next((p for p in parameters if "Cache" in str(p.annotation)), None)
    if found is None:
        raise SnapevalError(
            f"transformers {transformers_version()}: {type(module).__name__}.forward takes no cache "
            f"(none of {', '.join(CACHE_PARAMETERS)}); {supported_range()}",
            "model",
        )
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    place = [p.name for p in parameters if p.kind in positional]
    names = (found.name, *(name for name in CACHE_PARAMETERS if name != found.name))
    return names, place.index(found.name) if found.name in place else None


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword under which ``model``'s ``forward`` takes a cache: the first of
    :data:`~snapeval.couplings.CACHE_PARAMETERS` it names (``past_key_values`` before transformers 5.24,
    where ``cache`` is new and the old name a deprecated alias)."""
    return _known_cache_parameter(inspect.signature(model.forward).parameters) or CACHE_PARAMETERS[-1]


def _known_cache_parameter(parameters: Mapping[str, inspect.Parameter]) -> str | None:
    """The first of :data:`~snapeval.couplings.CACHE_PARAMETERS` among ``parameters``, if any."""
    return next((name for name in CACHE_PARAMETERS if name in parameters), None)


def _passing_the_cache(forward: Callable, names: tuple[str, ...], place: int | None) -> Callable:
    """An attention module's ``forward`` that also hands the cache it takes (as the first of ``names``,
    keyword or positional at ``place``, or under another of ``names``) to the attention function
    (transformers passes the module's extra keyword arguments on to it), and, to a cache that
    ``wants_layer_inputs``, the forward's own keyword inputs (hidden states, position embeddings)."""

    @functools.wraps(forward)
    def forward_with_cache(*args, **kwargs):
        for extra_name in (CACHE_KWARG, INPUTS_KWARG):  # passed on by an enclosing module with a layer_idx
            kwargs.pop(extra_name, None)
        if place is not None and len(args) > place:
            cache = args[place]
        else:
            cache = next((kwargs[key] for key in names if kwargs.get(key) is not None), None)
        extra = {CACHE_KWARG: cache}
        if isinstance(cache, AttendedCache) and cache.wants_layer_inputs:
            extra[INPUTS_KWARG] = {key: value for key, value in kwargs.items() if key not in names}
        return forward(*args, **extra, **kwargs)

    setattr(forward_with_cache, CACHE_KWARG, True)
    return forward_with_cache


LAYER_TYPES = ("full_attention", "sliding_attention")  # the layer types the engine caches


def check_model_config(config: PretrainedConfig) -> None:
    """Refuse, in one line naming the family and the feature, a model whose attention the engine cannot
    cache exactly (read from its config alone, before any weight loads)."""
    family = getattr(config, "model_type", type(config).__name__)
    for layer_type in dict.fromkeys(getattr(config, "layer_types", None) or []):
        if layer_type not in LAYER_TYPES:
            raise SnapevalError(
                f"{family}: {layer_type} layers are not supported by the KV-cache engine (it caches "
                f"{' and '.join(LAYER_TYPES)} layers)",
                "model",
            )


def install(model: PreTrainedModel) -> PreTrainedModel:
    """Register the ``snapeval`` attention and switch ``model`` to it (a no-op for other caches); each
    attention module's ``forward`` passes its cache on (see the module docstring).

    Every attention module also gets its base attention as ``BASE_ATTENTION`` (SDPA, or the family's
    eager attention for a model loaded with eager attention: see :func:`snapeval.models.base_attention`),
    the model's RoPE frequencies as ``ROPE_INV_FREQ`` (or None) and how to re-rotate its keys as
    ``ROPE_ROTATION`` (a :class:`~snapeval.cache.rope.KeyRotation`, or why not), for caches that re-rotate
    keys, its rotary embedding module as ``ROTARY_MODULE``, for scorers that rotate queries of their own,
    and the query heads it computes as ``LOCAL_HEADS`` (a rank's share under tensor parallel). A family
    the engine cannot serve is refused in one line (:func:`check_model_config`).
    """
    if not getattr(model, "_supports_attention_backend", False):
        raise SnapevalError(
            f"{model.config.model_type}: {type(model).__name__} does not route attention through "
            "transformers' attention interface, so the KV-cache engine cannot drive it",
            "model",
        )
    check_model_config(model.config)
    attention_modules = [module for module in model.modules() if hasattr(module, "layer_idx")]
    if any(is_latent(module) for module in attention_modules) and not at_least(MLA_LATENT_CACHE):
        raise SnapevalError(
            f"{model.config.model_type}: MLA needs transformers >= {MLA_LATENT_CACHE}, which caches its "
            f"latent (installed: {transformers_version()})",
            "model",
        )
    local_heads = query_heads_here(model, cache_keyword(model))  # a rank's share under tensor parallel
    inv_freq = rope_inv_freq(model)
    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    implementation = model.config._attn_implementation
    eager = implementation in ("eager", EAGER_ATTENTION_NAME)
    rotations = {}  # per layer type: Gemma 3's local and global layers turn keys by their own bases
    for module in attention_modules:
        if hasattr(module, "head_dim") or is_latent(module):
            layer_type = getattr(module, "layer_type", None)
            if layer_type not in rotations:
                rotations[layer_type] = key_rotation(model, module, inv_freq)
    for module in attention_modules:
        rotation = rotations.get(getattr(module, "layer_type", None), next(iter(rotations.values()), None))
        setattr(module, ROPE_INV_FREQ, inv_freq)
        vars(module)[ROPE_ROTATION] = rotation
        vars(module)[ROTARY_MODULE] = rotary  # a plain reference, not a registered submodule
        vars(module)[LOCAL_HEADS] = local_heads
        vars(module)[BASE_ATTENTION] = _eager_attention(model, module) if eager else sdpa_attention_forward
        absorbs = is_latent(module) and not eager and hasattr(module, "expand_kv")
        if absorbs and EXPAND_LATENT not in vars(module):
            vars(module)[EXPAND_LATENT] = module.expand_kv  # the snapeval attention expands, or absorbs
            vars(module)[UP_PROJECTIONS] = up_projections(module)
            module.expand_kv = _latent_as_it_is
        if not getattr(module.forward, CACHE_KWARG, False):
            module.forward = _passing_the_cache(module.forward, *cache_names(module))
    if not getattr(model, IN_LOOP_HOOK, False):
        model.register_forward_hook(_check_engine_in_loop, with_kwargs=True)
        vars(model)[IN_LOOP_HOOK] = True
    name = EAGER_ATTENTION_NAME if eager else ATTENTION_NAME
    AttentionInterface.register(name, snapeval_attention)
    AttentionMaskInterface.register(name, eager_mask if eager else sdpa_mask)
    model.set_attn_implementation(name)
    return model


def _latent_as_it_is(latent: torch.Tensor, rotary: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An installed MLA module's ``expand_kv``: the latent goes to the snapeval attention unexpanded."""
    return latent, rotary


def _check_engine_in_loop(model: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
    """After an installed model's forward: every snapeval cache it was given saw its last layer attended
    (the layers before it are checked as the next one takes its keys). The batcher's rows are checked by
    their caller once the step's tokens are read
    (:meth:`~snapeval.decode.continuous.classes.RowClasses.check_step_attended`)."""
    if torch.compiler.is_compiling():
        return
    for value in (*args, *kwargs.values()):
        if isinstance(value, SnapevalCache):
            value.check_engine_in_loop()


def _eager_attention(model: PreTrainedModel, module: torch.nn.Module) -> Callable:
    """The eager attention of ``module``'s family (the function its modeling file defines, which applies
    the family's softcap or sinks), for a model that cannot run SDPA."""
    function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if function is None:
        raise SnapevalError(
            f"{model.config.model_type}: its attention defines no eager_attention_forward for the engine to "
            "call, and SDPA is not available for it",
            "model",
        )
    return function
