"""The uncompressed reference cache."""

from __future__ import annotations

from snapeval.cache.base import SnapevalCache
from snapeval.cache.method import LayerPrompt, Selection
from snapeval.configs.cache import Full


class FullCache(SnapevalCache):
    """Full KV cache: keeps every prompt token and appends every generated one.

    The reference every compressed method is measured against. Padding slots are masked, never attended.
    """

    params_class = Full

    def select(self, prompt: LayerPrompt) -> Selection:
        return Selection()
