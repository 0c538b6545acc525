"""Any kvpress scorer press (NVIDIA kvpress, https://github.com/NVIDIA/kvpress) as a snapeval method."""

from __future__ import annotations

import importlib
from typing import Any

from snapeval.cache.attention import ROTARY_MODULE
from snapeval.cache.base import LayerPrompt, Selection, SnapevalCache
from snapeval.cache.mla import is_latent
from snapeval.cache.scoring import top_columns
from snapeval.configs.cache import Kvpress
from snapeval.configs.values import press_arguments
from snapeval.errors import SnapevalError

INSTALL = "pip install 'snapeval[kvpress]'"


class KvpressCache(SnapevalCache):
    """kvpress: one of kvpress's scorer presses chooses what each layer keeps of its prompt.

    At the end of each layer's prefill the press scores every prompt token per KV head (its ``score``,
    from the layer's attention module, hidden states, keys, values and position embeddings, exactly as
    kvpress's own forward hook would call it), and the ``budget`` best-scored tokens are kept (or, with
    ``compression_ratio``, kvpress's share removed: ``int(L * (1 - compression_ratio))`` kept, its
    ``compute_n_kept``); generated tokens are appended. snapeval does the keeping, so the result lands
    in its slots, batcher, database and figures like any other method. A ``budget`` (a sweep's) replaces
    the ratio. ``press`` names a class of
    ``kvpress`` with a ``score`` method (``SnapKVPress``, ``ExpectedAttentionPress``, ``KnormPress``,
    ``TOVAPress``, ...); ``press_args`` is a JSON object of its other fields (e.g.
    ``{"window_size": 64, "kernel_size": 5}``). Needs the extra: ``pip install 'snapeval[kvpress]'``.
    Padding columns are never kept. Parameters and their defaults: :class:`~snapeval.configs.cache.Kvpress`.
    """

    method = "kvpress"
    label = "kvpress"
    wants_layer_inputs = True
    params_class = Kvpress

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.scorer = _press(self.press, self.press_args)

    def kept(self, prompt_length: int) -> int:
        """Prompt tokens a layer keeps."""
        if self.budget is not None:
            return min(prompt_length, self.budget)
        return int(prompt_length * (1 - self.compression_ratio))

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return self.kept(prompt_length) + new_tokens

    def select(self, prompt: LayerPrompt) -> Selection:
        if is_latent(prompt.module):
            raise SnapevalError(
                f"{prompt.module.config.model_type}: kvpress presses score per-head keys, and multi-head "
                "latent attention caches one latent per token; use a snapeval method on this model",
                "cache",
            )
        kept = self.kept(int(prompt.valid.sum(dim=-1).max()))
        if prompt.length <= kept:
            return Selection()
        module = prompt.module
        if "rotary_emb" not in vars(module):  # kvpress's press(model) gives each attention module this
            vars(module)["rotary_emb"] = vars(module).get(ROTARY_MODULE)
        scorer_kwargs = {**prompt.inputs, "attention_mask": None}
        hidden_states = prompt.inputs.get("hidden_states")
        scores = self.scorer.score(
            prompt.module, hidden_states, prompt.keys, prompt.values, None, scorer_kwargs
        )
        priority = scores.float().masked_fill(~prompt.valid[:, None, :], float("-inf"))
        return Selection(pinned=top_columns(priority, kept))


def _press(name: str, press_args: str) -> Any:
    """An instance of kvpress's press class ``name`` with ``press_args`` (a JSON object)."""
    arguments = press_arguments(press_args)
    try:
        kvpress = importlib.import_module("kvpress")
    except ImportError:
        raise SnapevalError(f"kvpress is not installed; {INSTALL}", "cache.press") from None
    cls = getattr(kvpress, str(name), None)
    if cls is None or not callable(getattr(cls, "score", None)):
        scorers = sorted(
            n for n in dir(kvpress) if n.endswith("Press") and hasattr(getattr(kvpress, n), "score")
        )
        raise SnapevalError(
            f"no kvpress scorer press {name!r}; choose one of {', '.join(scorers)}", "cache.press"
        )
    try:
        return cls(**arguments)
    except (ValueError, TypeError, AssertionError) as error:
        raise SnapevalError(f"{name} does not take {press_args}: {error}", "cache.press_args") from None
