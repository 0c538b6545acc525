"""What a rank holds of a model's weights under tensor parallel: the parts its family's TP plan splits
(each rank a 1/tp share) and the parts every rank holds whole.

The plans are transformers' (``base_model_tp_plan`` of a family's config class, the plans ``snapeval``
runs under torchrun: :mod:`snapeval.models.parallel`), read part by part
(:data:`~snapeval.memory.parameters.GROUPS`) and written down here, so that the estimator and the report
load no torch; ``tests/test_tensor_parallel_moe.py`` checks them against the installed transformers'. Every
plan splits attention, the dense MLPs and the experts, and the embeddings and the LM head over the
vocabulary, unless :data:`WHOLE_IN_PLAN` says it keeps a part whole; routers and norms are whole on every
rank. A family transformers gives no plan is estimated so too (snapeval itself refuses to split it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapeval.memory.parameters import parameter_groups

WHOLE = ("routers", "norms")
"""Held whole on every rank by every plan."""
WHOLE_IN_PLAN = {
    "deepseek_v3": ("attention",),  # its plan splits the MLPs and experts alone: MLA attention whole
    "gpt_oss": ("attention", "experts"),  # its plan splits the embeddings alone (its EP plan, the experts)
    "qwen2_moe": ("shared_experts",),
}
"""The parts a family's plan (transformers 5.24) leaves whole on every rank, besides :data:`WHOLE`."""


def whole_on_every_rank(config: Mapping[str, Any]) -> dict[str, int]:
    """The parts of the model of ``config`` (a ``config.json`` dict) that every rank holds whole when its
    family's TP plan splits it, each with its parameters (parts without any left out)."""
    whole = WHOLE + WHOLE_IN_PLAN.get(config.get("model_type") or "", ())
    return {part: count for part, count in parameter_groups(config).items() if count and part in whole}
