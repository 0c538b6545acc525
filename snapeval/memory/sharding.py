"""What a rank holds of a model's weights under tensor parallel: the parts its family's TP plan splits
(each rank a 1/tp share) and the parts every rank holds whole.

The plan is the one transformers gives the family (``base_model_tp_plan`` of its config class, the plan
``snapeval`` runs under torchrun: :mod:`snapeval.models.parallel`), read part by part
(:data:`~snapeval.memory.parameters.GROUPS`): attention is split where a rule names ``self_attn`` (Llama's
heads) and whole where none does (DeepSeek-V3's MLA, GPT-OSS's), likewise the dense MLPs, the routed and
the shared experts; the embeddings and the LM head are split over the vocabulary (transformers 5.24
shards both once a plan exists); routers and norms are whole. A family transformers gives no plan is
estimated as if every part but routers and norms were split (snapeval itself refuses to split it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapeval.memory.parameters import GROUPS, parameter_groups

VOCABULARY = ("embeddings", "lm_head")
"""Split over the vocabulary whenever the family has a plan (``embedding_rowwise``,
``colwise_gather_output``)."""
RULES = {
    "attention": (".self_attn.",),
    "mlp": (".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj"),
    "experts": (".mlp.experts",),
    "shared_experts": (".shared_expert",),
}
"""A part is split when a rule of the plan names it (``layers.*.self_attn.q_proj`` splits attention)."""
WHOLE = ("routers", "norms")
"""Held whole on every rank by every plan."""


def family_plan(model_type: str | None) -> dict[str, str] | None:
    """The TP plan transformers gives the base model of family ``model_type`` ({} for one without a
    plan); None for a family the installed transformers does not know."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return None
    return dict(getattr(CONFIG_MAPPING[model_type], "base_model_tp_plan", None) or {})


def split_parts(plan: Mapping[str, str] | None) -> tuple[str, ...]:
    """The parts (:data:`~snapeval.memory.parameters.GROUPS`) that ``plan`` splits across the ranks;
    every part but :data:`WHOLE` where there is no plan (None or {})."""
    if not plan:
        return tuple(part for part in GROUPS if part not in WHOLE)
    named = {part for part, words in RULES.items() if any(word in rule for rule in plan for word in words)}
    return tuple(part for part in GROUPS if part in VOCABULARY or part in named)


def whole_on_every_rank(config: Mapping[str, Any]) -> dict[str, int]:
    """The parts of the model of ``config`` (a ``config.json`` dict) that every rank holds whole when its
    family's TP plan splits it, each with its parameters (parts without any left out)."""
    split = split_parts(family_plan(config.get("model_type")))
    return {part: count for part, count in parameter_groups(config).items() if count and part not in split}
