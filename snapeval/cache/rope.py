"""Rotating RoPE keys to another position, for caches that move tokens inside the cache."""

from __future__ import annotations

import torch


def rotate_keys(keys: torch.Tensor, offset: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE keys (batch, kv_heads, n, d) moved ``offset`` (batch, kv_heads) positions forward.

    transformers' convention: dimension i pairs with i + d/2, and both share frequency i. The keys already
    carry the model's ``attention_scaling``; a rotation leaves it as it is.
    """
    angles = offset[..., None, None].float() * inv_freq.to(keys.device)
    cos, sin = angles.cos().to(keys.dtype), angles.sin().to(keys.dtype)
    first, second = keys.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
