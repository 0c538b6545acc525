"""The assumptions behind a memory estimate, and what in it deserves a second look, as sentences."""

from __future__ import annotations

from snapeval.configs.cache import FULL
from snapeval.memory.geometry import ModelGeometry
from snapeval.memory.hardware import HardwareProfile
from snapeval.memory.kv import cached_tokens, kv_heads_per_rank
from snapeval.memory.units import format_bytes, format_count

UNITS_NOTE = (
    "capacities are the published decimal figures (1 GB = 10^9 B), shown in binary units "
    "(1 GiB = 2^30 B); activations and runtime workspace are not counted"
)
ESTIMATED_PARAMETERS_NOTE = (
    "parameter count estimated from the config (embeddings, attention, MLP/experts, LM head)"
)


def estimate_notes(
    geometry: ModelGeometry,
    hardware: HardwareProfile,
    method: str,
    context: int,
    budget: int | None,
    tp: int,
    weights_per_socket: int,
) -> tuple[str, ...]:
    """One sentence per assumption or caveat of the estimate."""
    beyond = geometry.max_positions is not None and context > geometry.max_positions
    notes = [positions_note(geometry, context)] if beyond else []
    if tp > 1:
        notes.append(kv_layout_note(geometry, hardware, tp))
    if geometry.num_sliding_layers:
        notes.append(
            f"{geometry.num_sliding_layers} of {geometry.num_layers} layers use sliding-window attention: "
            f"they cache at most {geometry.sliding_window:,} tokens"
        )
    if method != FULL and budget is not None and cached_tokens(method, context, budget) > context:
        notes.append(
            f"{method} preallocates budget={budget:,} slots, more than the {context:,}-token context"
        )
    notes.append(weights_note(geometry, hardware, tp, weights_per_socket))
    if geometry.parameters_estimated:
        notes.append(ESTIMATED_PARAMETERS_NOTE)
    onchip = hardware.tier("onchip")
    if onchip is not None:
        fraction = f"{hardware.onchip_kv_fraction:.0%}"
        notes.append(f"assumes {fraction} of the {onchip.label} can hold KV (onchip_kv_fraction)")
    notes.append(UNITS_NOTE)
    return tuple(notes)


def positions_note(geometry: ModelGeometry, context: int) -> str:
    """A context longer than the model's positions: the bytes are right, whether the model runs so long
    is another matter."""
    return (
        f"context: {context:,} tokens exceed the model's {geometry.max_positions:,} positions "
        "(max_position_embeddings): it runs that long only with rope scaling, if at all"
    )


def kv_layout_note(geometry: ModelGeometry, hardware: HardwareProfile, tp: int) -> str:
    """How the KV cache is laid out over ``tp`` sockets: split, or replicated and by how much."""
    if geometry.is_mla:
        latent = geometry.kv_lora_rank + geometry.qk_rope_head_dim
        if hardware.mla_latent_sharded:
            return f"MLA latent ({latent} wide) sharded over the {tp} sockets (mla_latent_sharded: true)"
        return (
            f"MLA latent ({latent} wide) replicated on each of the {tp} sockets, {tp}x the KV bytes "
            "across sockets (mla_latent_sharded: false)"
        )
    kv_heads = geometry.num_kv_heads
    heads = kv_heads_per_rank(kv_heads, tp)
    if kv_heads % tp:
        return (
            f"tp={tp} does not divide the {kv_heads} KV heads: heads are replicated, each socket holds "
            f"ceil({kv_heads}/{tp}) = {heads}, {heads * tp / kv_heads:.2f}x the KV bytes across sockets"
        )
    return f"{kv_heads} KV heads split over {tp} sockets: {heads} per socket"


def weights_note(geometry: ModelGeometry, hardware: HardwareProfile, tp: int, weights_per_socket: int) -> str:
    """Where the weights go: HBM, spilling to DDR, or nowhere; under tensor parallel, what every socket
    holds whole (:attr:`~snapeval.memory.geometry.ModelGeometry.replicated`)."""
    placement = "weights placed in HBM"
    if tp > 1 and geometry.replicated is None:
        placement += f", sharded evenly over {tp} sockets (the config does not size the parts a plan splits)"
    elif tp > 1:
        whole = ", ".join(
            f"{part.replace('_', ' ')} ({format_count(count)})" for part, count in geometry.replicated
        )
        placement += f", split over {tp} sockets as the family's TP plan splits them; whole on each: {whole}"
    overflow = weights_per_socket - hardware.tier("hbm").capacity
    if overflow <= 0:
        return f"{placement}; KV gets the rest"
    ddr = hardware.tier("ddr")
    if ddr is None or overflow > ddr.capacity:
        where = "HBM" if ddr is None else "HBM and DDR"
        return f"{placement}: they exceed {where} per socket and do not fit; raise tp or lower weights_dtype"
    return f"{placement}: {format_bytes(overflow)} per socket overflow HBM into DDR, leaving no HBM for KV"
