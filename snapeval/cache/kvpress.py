"""Any kvpress scorer press (NVIDIA kvpress, https://github.com/NVIDIA/kvpress) as a snapeval method."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from snapeval.cache.attention import ROTARY_MODULE
from snapeval.cache.base import SnapevalCache
from snapeval.cache.eviction import Eviction
from snapeval.cache.method import LayerPrompt, Selection
from snapeval.cache.mla import is_latent
from snapeval.cache.ring import EMPTY
from snapeval.cache.scoring import top_columns
from snapeval.configs.cache import Kvpress, press_arguments
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
    Padding columns are never kept.

    ``decoding`` compresses while decoding too, as kvpress's ``DecodingPress`` with the press as its
    ``base_press`` and ``target_size=budget`` (a prompt longer than ``budget``: its
    ``PrefillDecodingPress``, the same press cutting the prompt to ``budget`` first): a row holds
    ``budget + compression_interval`` slots, and every ``compression_interval`` decode steps each layer's
    press scores what it holds, from the attention inputs of the steps since the last compression (at
    most ``hidden_states_buffer_size + 1``: kvpress's buffer and the step's own) and the step's position
    embeddings, and keeps its ``budget`` best in kvpress's order (its ``topk``'s), where the next tokens
    follow. The ratio that yields ``budget`` and the count kept are kvpress's own functions. Parameters
    and their defaults: :class:`~snapeval.configs.cache.Kvpress`.
    """

    wants_layer_inputs = True
    params_class = Kvpress

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.scorer = _press(self.press, self.press_args)
        self.decoding_press = _decoding_press(self) if self.decoding else None

    def kept(self, prompt_length: int) -> int:
        """Prompt tokens a layer keeps."""
        if self.budget is not None:
            return min(prompt_length, self.budget)
        return int(prompt_length * (1 - self.compression_ratio))

    def decode_eviction(self, prompt_length: int) -> Eviction | None:
        if not self.decoding:
            return None
        # kvpress compresses at every step whose tokens reach target_size: with a budget of 1, each one
        every = 1 if self.budget == 1 else self.compression_interval
        hidden = min(self.hidden_states_buffer_size + 1, every)
        return Eviction(keep=self.budget, slots=self.budget + every, every=every, hidden=hidden)

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        eviction = self.decode_eviction(prompt_length)
        if eviction is not None:
            return eviction.slots
        return self.kept(prompt_length) + new_tokens

    def select(self, prompt: LayerPrompt) -> Selection:
        if is_latent(prompt.module):
            raise SnapevalError(
                f"{prompt.module.config.model_type}: kvpress presses score per-head keys, and multi-head "
                "latent attention caches one latent per token; use a snapeval method on this model",
                "cache",
            )
        length = int(prompt.valid.sum(dim=-1).max())
        eviction = self.decode_eviction(length)
        if eviction is not None:
            return self._select_to_budget(prompt, length, eviction.slots)
        kept = self.kept(length)
        if prompt.length <= kept:
            return Selection()
        scores = self._scores(prompt.module, prompt.inputs, prompt.keys, prompt.values)
        priority = scores.float().masked_fill(~prompt.valid[:, None, :], float("-inf"))
        return Selection(pinned=top_columns(priority, kept))

    def _select_to_budget(self, prompt: LayerPrompt, length: int, slots: int) -> Selection:
        """kvpress's prefilling press at the ratio that keeps ``budget``: its ``topk``, in its order."""
        if prompt.length <= self.budget:
            return Selection(capacity=slots)
        ratio, kept = self._target(length, self.budget)
        scores = self._scores(prompt.module, prompt.inputs, prompt.keys, prompt.values, ratio)
        priority = scores.masked_fill(~prompt.valid[:, None, :], float("-inf"))
        order = priority.topk(kept, dim=-1).indices
        pinned = order.masked_fill(priority.gather(-1, order) == float("-inf"), EMPTY)
        return Selection(pinned=pinned, capacity=slots)

    def reselect(self, held: LayerPrompt, keep: int) -> torch.Tensor:
        """kvpress's ``DecodingPress.compress`` of the held slots: the press's scores at the ratio that
        keeps ``keep``, their ``topk`` in its order."""
        ratio, kept = self._target(held.length, keep)
        scores = self._scores(held.module, held.inputs, held.keys, held.values, ratio)
        return scores.topk(kept, dim=-1).indices

    def _target(self, length: int, keep: int) -> tuple[float, int]:
        """kvpress's compression ratio that keeps ``keep`` of ``length`` tokens, and the count it keeps."""
        from kvpress.utils import compute_n_kept

        ratio = self.decoding_press._find_target_compression_ratio(length, keep)
        return ratio, compute_n_kept(length, ratio)

    def _scores(
        self,
        module: torch.nn.Module,
        inputs: Mapping[str, Any],
        keys: torch.Tensor,
        values: torch.Tensor,
        ratio: float | None = None,
    ) -> torch.Tensor:
        """(batch, kv_heads, L) the press's scores, called as kvpress's hook calls them (with its
        ``compression_ratio`` set to ``ratio`` meanwhile, as ``DecodingPress`` does; None: as made)."""
        if "rotary_emb" not in vars(module):  # kvpress's press(model) gives each attention module this
            vars(module)["rotary_emb"] = vars(module).get(ROTARY_MODULE)
        kwargs = {**inputs, "attention_mask": None}
        arguments = (module, inputs.get("hidden_states"), keys, values, None, kwargs)
        if ratio is None:
            return self.scorer.score(*arguments)
        made, self.scorer.compression_ratio = self.scorer.compression_ratio, ratio
        try:
            return self.scorer.score(*arguments)
        finally:
            self.scorer.compression_ratio = made


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


def _decoding_press(cache: KvpressCache) -> Any:
    """kvpress's ``DecodingPress`` around the cache's press (it takes only a ``ScorerPress``)."""
    from kvpress import DecodingPress, ScorerPress

    if not isinstance(cache.scorer, ScorerPress):
        raise SnapevalError(
            f"{cache.press} is not a ScorerPress, which kvpress's DecodingPress needs", "cache.press"
        )
    return DecodingPress(
        base_press=cache.scorer,
        compression_interval=cache.compression_interval,
        target_size=cache.budget,
        hidden_states_buffer_size=cache.hidden_states_buffer_size,
    )
