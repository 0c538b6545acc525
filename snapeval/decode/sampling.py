"""Next-token choice for a batch of rows, each reproducible from its own seed whatever batch it is in.

A row's ``k``-th token (``counter = k``) is drawn with the uniform number ``uniform(seed, k)``, a
counter-based hash (no generator state), by inverse transform sampling over the token ids in their
natural order. So a row draws the same tokens alone or in any batch, at any slot, refilled or not, and
the whole choice is a few tensor operations: no host synchronisation, no per-row Python, one graph
under ``torch.compile``. Walking the vocabulary in id order (not by probability) keeps the choice stable
under float round-off: two rows whose logits differ in the last bits pick different tokens only if the
uniform falls within that round-off of a boundary.

Greedy rows take the argmax. Sampled rows divide the logits by their temperature and, with ``top_p`` <
1, keep the smallest set of most probable tokens whose mass reaches ``top_p`` (nucleus sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Sampling:
    """Greedy when ``do_sample`` is false; else temperature / nucleus sampling from ``seed``. The
    generator reads 64 bits of the seed: a larger one is taken modulo 2**64 (as a signed int64, so that
    a tensor holds it; seeds below 2**63 are unchanged)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", (int(self.seed) + 2**63) % 2**64 - 2**63)


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for int64 ``x`` < 2**32, without overflowing int64."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash with full avalanche (C. Wellons' "lowbias32")."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """(rows,) float32 in [0, 1): the ``counter``-th uniform number of each row's ``seed`` (int64)."""
    state = _mix32((counter & _MASK32) ^ 0x9E3779B9)
    state = _mix32(state ^ ((seed >> 32) & _MASK32))
    state = _mix32(state ^ (seed & _MASK32))
    return (state >> 8).to(torch.float32) * 2.0**-24


def sample_tokens(
    logits: torch.Tensor,
    do_sample: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    counter: torch.Tensor,
    sampling: bool = True,
    nucleus: bool = True,
) -> torch.Tensor:
    """(rows,) next token of each row from ``logits`` (rows, vocab); the other arguments are (rows,).

    ``sampling``/``nucleus`` false skip work no row needs (no row samples / no row has top_p < 1); they
    never change a result.
    """
    greedy = logits.argmax(dim=-1)
    if not sampling:
        return greedy
    probabilities = (logits.float() / temperature[:, None].float()).softmax(dim=-1)
    if nucleus:
        ordered = probabilities.sort(dim=-1, descending=True).values
        outside = ordered.cumsum(dim=-1) - ordered > top_p[:, None]
        smallest_kept = ordered.masked_fill(outside, float("inf")).amin(dim=-1)
        smallest_kept = torch.where(top_p >= 1.0, 0.0, smallest_kept)
        probabilities = probabilities.masked_fill(probabilities < smallest_kept[:, None], 0.0)
    cumulative = probabilities.cumsum(dim=-1)
    target = uniform(seed, counter) * cumulative[:, -1]
    drawn = torch.searchsorted(cumulative, target[:, None].contiguous(), right=True)[:, 0]
    drawn = drawn.clamp(max=logits.shape[-1] - 1)
    return torch.where(do_sample, drawn, greedy)


def sample_one(logits: torch.Tensor, sampling: Sampling, counter: int) -> int:
    """The token one row draws from ``logits`` (vocab,) as its ``counter``-th token."""
    device = logits.device
    return int(
        sample_tokens(
            logits[None],
            torch.tensor([sampling.do_sample], device=device),
            torch.tensor([sampling.temperature], device=device),
            torch.tensor([sampling.top_p], device=device),
            torch.tensor([sampling.seed], device=device),
            torch.tensor([counter], device=device),
            sampling=sampling.do_sample,
            nucleus=sampling.top_p < 1.0,
        )
    )
