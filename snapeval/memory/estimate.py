"""Memory estimate of a KV-cache compression method for a model on a hardware profile."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from snapeval.configs.cache import FULL
from snapeval.errors import SnapevalError
from snapeval.memory.geometry import ModelGeometry, load_geometry
from snapeval.memory.hardware import TIER_NAMES, HardwareProfile, MemoryTier, load_hardware
from snapeval.memory.kv import (
    SNAPSTREAM,
    cached_tokens,
    ceil_div,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    method_names,
    weights_bytes,
)
from snapeval.memory.notes import estimate_notes

MAX_TOKENS = 10_000_000
"""The most tokens a ``context`` or ``budget`` may hold: 76x the 131,072 positions of today's long-context
models; beyond it an estimate is only arithmetic (a model's own positions are a note, not a limit)."""


@dataclass(frozen=True)
class TierFit:
    """How the KV cache of the batch sits in one memory tier of a socket."""

    name: str
    label: str
    capacity: int
    kv_available: int
    fits_full: bool
    fits_compressed: bool
    max_sequences_full: int
    max_sequences_compressed: int


@dataclass(frozen=True)
class MemoryEstimate:
    """KV-cache and weights bytes, whole model and per socket, and how they fit each memory tier."""

    model: str
    hardware: str
    attention: str
    context: int
    batch: int
    tp: int
    nodes: int
    method: str
    budget: int | None
    kv_dtype: str
    weights_dtype: str
    num_parameters: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_socket: int
    kv_replication: float
    tokens_full: int
    tokens_compressed: int
    kv_bytes_per_sequence_full: int
    kv_bytes_per_sequence_compressed: int
    kv_bytes_per_sequence_full_per_socket: int
    kv_bytes_per_sequence_compressed_per_socket: int
    weights_bytes: int
    weights_bytes_per_socket: int
    tiers: tuple[TierFit, ...]
    notes: tuple[str, ...]

    @property
    def reduction(self) -> float:
        """KV bytes of the full cache over those of the compressed one."""
        return self.kv_bytes_per_sequence_full / self.kv_bytes_per_sequence_compressed

    def as_row(self) -> dict[str, Any]:
        """A flat dict for a database row or a DataFrame: one column set per tier, None where absent."""
        row = {field.name: getattr(self, field.name) for field in fields(self) if field.name != "tiers"}
        row["notes"] = "; ".join(self.notes)
        row["reduction"] = self.reduction
        by_name = {tier.name: asdict(tier) for tier in self.tiers}
        for name in TIER_NAMES:
            tier = by_name.get(name, {})
            for key in TierFit.__dataclass_fields__:
                if key != "name":
                    row[f"{name}_{key}"] = tier.get(key)
        return row


def estimate(
    model: ModelGeometry | str,
    hardware: HardwareProfile | str,
    *,
    context: int,
    batch: int = 1,
    tp: int = 1,
    method: str | None = None,
    budget: int | None = None,
    kv_dtype: str = "bf16",
    weights_dtype: str | None = None,
) -> MemoryEstimate:
    """Estimate the memory of ``batch`` sequences of ``context`` tokens over ``tp`` sockets.

    ``method`` defaults to ``snapstream`` when a ``budget`` is given, else ``full``; ``weights_dtype``
    None: the dtype the checkpoint stores (``fp8`` for DeepSeek-V3/R1's release), else bf16.
    """
    geometry = load_geometry(model) if isinstance(model, str) else model
    profile = load_hardware(hardware) if isinstance(hardware, str) else hardware
    for field, value in (("context", context), ("batch", batch), ("tp", tp), ("budget", budget)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise SnapevalError(f"must be a positive integer, got {value!r}", field)
        if field in ("context", "budget") and value is not None and value > MAX_TOKENS:
            shown = f"{value:,}" if value < 10**15 else f"{value:.3g}"
            raise SnapevalError(f"{shown} tokens exceed the estimator's cap of {MAX_TOKENS:,}", field)
    method = resolve_method(method, budget)
    weights_dtype = weights_dtype or geometry.checkpoint_dtype or "bf16"
    tokens = cached_tokens(method, context, budget)
    layout = {"tp": tp, "mla_latent_sharded": profile.mla_latent_sharded}
    token_bytes = kv_bytes_per_token(geometry, kv_dtype)
    token_bytes_per_socket = kv_bytes_per_token(geometry, kv_dtype, **layout)
    full_per_socket = kv_bytes_per_sequence(geometry, context, kv_dtype, **layout)
    compressed_per_socket = kv_bytes_per_sequence(geometry, tokens, kv_dtype, **layout)
    weights_per_socket = weights_bytes(geometry, weights_dtype, tp)
    return MemoryEstimate(
        model=geometry.name,
        hardware=profile.name,
        attention=geometry.attention,
        context=context,
        batch=batch,
        tp=tp,
        nodes=ceil_div(tp, profile.sockets_per_node),
        method=method,
        budget=budget,
        kv_dtype=kv_dtype,
        weights_dtype=weights_dtype,
        num_parameters=geometry.num_parameters,
        kv_bytes_per_token=token_bytes,
        kv_bytes_per_token_per_socket=token_bytes_per_socket,
        kv_replication=token_bytes_per_socket * tp / token_bytes,
        tokens_full=context,
        tokens_compressed=tokens,
        kv_bytes_per_sequence_full=kv_bytes_per_sequence(geometry, context, kv_dtype),
        kv_bytes_per_sequence_compressed=kv_bytes_per_sequence(geometry, tokens, kv_dtype),
        kv_bytes_per_sequence_full_per_socket=full_per_socket,
        kv_bytes_per_sequence_compressed_per_socket=compressed_per_socket,
        weights_bytes=weights_bytes(geometry, weights_dtype),
        weights_bytes_per_socket=weights_per_socket,
        tiers=tuple(
            tier_fit(
                tier,
                kv_available(tier, profile, weights_per_socket),
                batch,
                full_per_socket,
                compressed_per_socket,
            )
            for tier in profile.tiers
        ),
        notes=estimate_notes(geometry, profile, method, context, budget, tp, weights_per_socket),
    )


def resolve_method(method: str | None, budget: int | None) -> str:
    """The method to estimate: ``snapstream`` by default with a budget, ``full`` without."""
    if method is None:
        return FULL if budget is None else SNAPSTREAM
    if method not in method_names() and ":" not in method:
        raise SnapevalError(f"unknown method {method!r}; choose one of {', '.join(method_names())}", "method")
    if method == FULL and budget is not None:
        budgeted = ", ".join(m for m in method_names() if m != FULL)
        raise SnapevalError(
            f"method=full keeps every token; drop budget or choose one of {budgeted}", "budget"
        )
    return method


def kv_available(tier: MemoryTier, hardware: HardwareProfile, weights_per_socket: int) -> int:
    """Bytes of ``tier`` one socket can give the KV cache.

    On-chip: ``onchip_kv_fraction`` of it. HBM: what the weights leave. DDR: what the weights that
    overflow HBM leave.
    """
    if tier.name == "onchip":
        return int(tier.capacity * hardware.onchip_kv_fraction)
    hbm_overflow = max(0, weights_per_socket - hardware.tier("hbm").capacity)
    return max(0, tier.capacity - (weights_per_socket if tier.name == "hbm" else hbm_overflow))


def tier_fit(tier: MemoryTier, available: int, batch: int, full: int, compressed: int) -> TierFit:
    """Whether ``batch`` sequences of ``full`` or ``compressed`` KV bytes fit in ``available`` bytes."""
    return TierFit(
        name=tier.name,
        label=tier.label,
        capacity=tier.capacity,
        kv_available=available,
        fits_full=batch * full <= available,
        fits_compressed=batch * compressed <= available,
        max_sequences_full=available // full,
        max_sequences_compressed=available // compressed,
    )
