"""Speculative prefill (Liu et al., 2025, arXiv:2502.02789; cross-family: "Cross-Family Speculative
Prefill"): a draft model reads the prompt and the target prefills only the tokens the draft attended to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from snapeval.cache.attention import cache_keyword
from snapeval.cache.base import SnapevalCache
from snapeval.cache.method import LayerPrompt, Selection, resolve_budget
from snapeval.cache.scoring import prompt_window_attention
from snapeval.cache.tensor_parallel import mean_over_ranks
from snapeval.configs.cache import SELF_DRAFT, SpeculativePrefill
from snapeval.errors import SnapevalError

DRAFTS_ATTRIBUTE = "snapeval_drafts"  # what attach_draft sets on a target model: draft name -> Draft


@dataclass(frozen=True)
class Draft:
    """A draft model (prepared with :func:`snapeval.cache.install`) and, when its tokenizer differs from
    the target's (cross-family), both tokenizers: importance then travels by character offsets."""

    model: Any
    tokenizer: Any = None
    target_tokenizer: Any = None


def attach_draft(target: Any, name: str, draft: Draft) -> None:
    """Make ``draft`` the draft called ``name`` (a ``cache.draft`` value) of ``target``."""
    setattr(target, DRAFTS_ATTRIBUTE, {**getattr(target, DRAFTS_ATTRIBUTE, {}), name: draft})


class SpeculativePrefillCache(SnapevalCache):
    """Speculative prefill: the target prefills ``budget`` prompt tokens chosen by a draft model's attention.

    The draft (``draft``: ``self`` for the target itself, in-family; else a model attached with
    :func:`attach_draft`, which the runner does for ``cache.draft=<model config or Hub id>``) prefills the
    whole prompt. A token's importance is the softmax attention the last ``window`` prompt queries pay it,
    summed over those queries, averaged over the draft's heads and layers, then average-pooled along the
    prompt (``kernel``). The last ``window`` tokens (the question) are always kept; the rest of the prompt
    is cut in chunks of ``chunk`` tokens ranked by mean importance, and the best chunks are kept (the last
    one taken may be cut short to hit the budget exactly). The target prefills only the kept tokens, at
    their original positions; decode continues at the prompt's length and appends. With a different
    tokenizer (cross-family) the draft reads the target's prompt text, and a target token's importance is
    the highest of the draft tokens its characters overlap (:func:`carry_scores`). A prompt of at most
    ``budget`` tokens is prefilled whole. The prefill seconds stored include the draft's. The choice is
    made in :meth:`prefill_input`, which snapeval's prefill calls (the runner, the continuous batcher and
    the lm-eval model prefill through :func:`snapeval.decode.generation.prefill_logits`); a plain
    ``model(ids, past_key_values=cache)`` call prefills the whole prompt.

    Choices the papers leave to us: the last prompt queries stand for the paper's look-ahead tokens (no
    draft decoding), importance is a mean (not a max) over heads and layers. ``ratio`` instead of
    ``budget`` keeps ``ceil(ratio * prompt length)``. Parameters and their defaults:
    :class:`~snapeval.configs.cache.SpeculativePrefill`.
    """

    selects_before_prefill = True
    params_class = SpeculativePrefill

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.columns: list[int] | None = None  # the prompt columns prefilled, once chosen
        self.prompt_length = 0

    def kept(self, prompt_length: int) -> int:
        """Prompt tokens the target prefills."""
        return min(prompt_length, resolve_budget(self.budget, self.ratio, prompt_length, self.window + 1))

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return self.kept(prompt_length) + new_tokens

    def prefill_input(self, model: Any, prompt_ids: Sequence[int]) -> tuple[list[int], list[int] | None]:
        ids = list(prompt_ids)
        self.prompt_length = len(ids)
        if len(ids) <= self.kept(len(ids)):
            return ids, None
        scores = draft_importance(_draft(model, self.draft), ids, self.window, self.kernel)
        self.columns = chosen_columns(scores, self.kept(len(ids)), self.chunk, self.window)
        return [ids[column] for column in self.columns], self.columns

    def select(self, prompt: LayerPrompt) -> Selection:
        return Selection()  # what the target prefilled is what it keeps

    def finish_prefill(self, layer_idx: int, *args, **kwargs) -> None:
        super().finish_prefill(layer_idx, *args, **kwargs)
        if self.columns is not None:  # slots remember their columns in the prompt, not in the kept part
            layer = self.layers[layer_idx]
            columns = torch.tensor(self.columns, device=layer.positions.device)
            layer.positions = columns[layer.positions.clamp(min=0)].masked_fill(layer.positions < 0, -1)
            layer.seen = self.prompt_length


class _ImportanceRecorder(SnapevalCache):
    """A draft's prefill cache that records each layer's window attention, averaged over heads (a
    rank's own heads under tensor parallel: :func:`draft_importance` averages the ranks' means)."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window, self.importance = window, []

    def select(self, prompt: LayerPrompt) -> Selection:
        self.importance.append(prompt_window_attention(prompt, self.window)[0].mean(dim=0))
        return Selection()


@torch.inference_mode()
def draft_importance(draft: Draft, prompt_ids: list[int], window: int, kernel: int) -> torch.Tensor:
    """(len(prompt_ids),) importance of every target prompt token, read from the draft's attention."""
    ids = prompt_ids
    if draft.tokenizer is not None:
        text = draft.target_tokenizer.decode(prompt_ids)
        target = draft.target_tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        if list(target["input_ids"]) != list(prompt_ids):
            raise SnapevalError(
                "cross-family drafting needs a prompt that re-encodes to itself", "cache.draft"
            )
        own = draft.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        ids = own["input_ids"]
    recorder = _ImportanceRecorder(window)
    device = draft.model.device
    ids_tensor = torch.tensor([ids], device=device)
    draft.model(input_ids=ids_tensor, logits_to_keep=1, **{cache_keyword(draft.model): recorder})
    scores = mean_over_ranks(torch.stack(recorder.importance).mean(dim=0).float(), draft.model).cpu()
    scores = F.avg_pool1d(scores[None], kernel, stride=1, padding=kernel // 2)[0]
    if draft.tokenizer is not None:
        return carry_scores(own["offset_mapping"], scores, target["offset_mapping"])
    return scores


def carry_scores(
    draft_offsets: Sequence[tuple[int, int]],
    draft_scores: torch.Tensor,
    target_offsets: Sequence[tuple[int, int]],
) -> torch.Tensor:
    """Target token scores from draft token scores over the same text: each target token takes the highest
    score of the draft tokens whose character spans overlap its own (0 where none does)."""
    characters = max([end for _, end in [*draft_offsets, *target_offsets]], default=0)
    per_character = torch.zeros(characters + 1)
    for (start, end), score in zip(draft_offsets, draft_scores.tolist(), strict=True):
        span = per_character[start:end]
        torch.maximum(span, torch.tensor(score), out=span)
    return torch.tensor(
        [float(per_character[start:end].max()) if end > start else 0.0 for start, end in target_offsets]
    )


def chosen_columns(scores: torch.Tensor, keep: int, chunk: int, window: int) -> list[int]:
    """The ``keep`` prompt columns to prefill: the last ``window``, then whole chunks of ``chunk`` columns
    of the rest by mean score (ties: the earlier chunk), the last one cut short to hit ``keep``."""
    length = scores.numel()
    prefix = length - window
    chunks = [range(start, min(start + chunk, prefix)) for start in range(0, prefix, chunk)]
    means = [float(scores[c.start : c.stop].mean()) for c in chunks]
    order = sorted(range(len(chunks)), key=lambda i: (-means[i], i))
    chosen: list[int] = []
    for index in order:
        chosen += list(chunks[index])[: keep - window - len(chosen)]
        if len(chosen) >= keep - window:
            break
    return sorted(chosen) + list(range(prefix, length))


def _draft(model: Any, name: str) -> Draft:
    if name == SELF_DRAFT:
        return Draft(model)
    drafts = getattr(model, DRAFTS_ATTRIBUTE, {})
    if name not in drafts:
        raise SnapevalError(
            f"no draft model {name!r} is attached to this model (attach_draft)", "cache.draft"
        )
    return drafts[name]
