"""A memory estimate as readable tables."""

from __future__ import annotations

from tabulate import tabulate

from snapeval.configs.cache import FULL
from snapeval.memory.estimate import MemoryEstimate
from snapeval.memory.units import format_bytes, format_count


def render(estimate: MemoryEstimate) -> str:
    """The title, the KV and weights table, the memory-tier table and the notes."""
    return "\n\n".join((_title(estimate), _bytes_table(estimate), _tier_table(estimate), _notes(estimate)))


def _title(e: MemoryEstimate) -> str:
    budget = "" if e.budget is None else f", budget {e.budget:,}"
    nodes = f"{e.nodes} node" + ("s" if e.nodes > 1 else "")
    return (
        f"{e.model} ({e.attention.upper()}, {format_count(e.num_parameters)} parameters) on {e.hardware}: "
        f"context {e.context:,}, batch {e.batch}, tp {e.tp} ({nodes}), method {e.method}{budget}, "
        f"KV {e.kv_dtype}, weights {e.weights_dtype}"
    )


def _bytes_table(e: MemoryEstimate) -> str:
    caches = [(FULL, e.tokens_full, e.kv_bytes_per_sequence_full, e.kv_bytes_per_sequence_full_per_socket)]
    if e.method != FULL:
        caches.append(
            (
                e.method,
                e.tokens_compressed,
                e.kv_bytes_per_sequence_compressed,
                e.kv_bytes_per_sequence_compressed_per_socket,
            )
        )
    rows = [("KV / token", _exact(e.kv_bytes_per_token), _exact(e.kv_bytes_per_token_per_socket))]
    rows += [_sizes(f"KV / sequence, {name} ({tokens:,} tokens)", *sizes) for name, tokens, *sizes in caches]
    if e.batch > 1:
        rows += [
            _sizes(f"KV / batch of {e.batch}, {name}", e.batch * whole, e.batch * per_socket)
            for name, _, whole, per_socket in caches
        ]
    if e.method != FULL:
        rows.append((f"KV reduction, full / {e.method}", f"{e.reduction:.2f}x", f"{e.reduction:.2f}x"))
    rows.append(_sizes(f"weights ({e.weights_dtype})", e.weights_bytes, e.weights_bytes_per_socket))
    headers = ("", "whole model", f"per socket (tp={e.tp})")
    return tabulate(rows, headers=headers, colalign=("left", "right", "right"))


def _tier_table(e: MemoryEstimate) -> str:
    methods = (FULL,) if e.method == FULL else (FULL, e.method)
    headers = [
        "memory tier\n(per socket)",
        "capacity",
        "free\nfor KV",
        *(f"batch of {e.batch}\nfits, {m}" for m in methods),
        *(f"max sequences\n{m}" for m in methods),
    ]
    rows = []
    for tier in e.tiers:
        fits = (tier.fits_full, tier.fits_compressed)[: len(methods)]
        counts = (tier.max_sequences_full, tier.max_sequences_compressed)[: len(methods)]
        rows.append(
            [
                tier.label,
                format_bytes(tier.capacity),
                format_bytes(tier.kv_available),
                *("yes" if fit else "no" for fit in fits),
                *(f"{count:,}" for count in counts),
            ]
        )
    return tabulate(rows, headers=headers, colalign=("left", *("right",) * (len(headers) - 1)))


def _notes(e: MemoryEstimate) -> str:
    return "\n".join(("notes:", *(f"- {note}" for note in e.notes)))


def _exact(size: int) -> str:
    return f"{size:,} B ({format_bytes(size)})" if size >= 1024 else f"{size:,} B"


def _sizes(label: str, whole: int, per_socket: int) -> tuple[str, str, str]:
    return label, format_bytes(whole), format_bytes(per_socket)
