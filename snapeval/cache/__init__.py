"""The KV-cache engine: one compression method per module, all built on :mod:`snapeval.cache.base`.

It knows nothing of tasks. Prepare a model with :func:`install`, then give a fresh cache to each
generation: ``model.generate(ids, past_key_values=build_cache({"method": "snapstream", "budget": 1024}))``.
The methods are those :mod:`snapeval.cache.registry` finds: adding one is adding a module, and its
parameters' dataclass to :mod:`snapeval.configs.cache`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapeval.cache.attention import install
from snapeval.cache.base import SnapevalCache
from snapeval.cache.full import FullCache
from snapeval.cache.grid import CacheGrid
from snapeval.cache.registry import method_class, method_classes
from snapeval.cache.sage_kv import SageKVCache
from snapeval.cache.snapkv import SnapKVCache
from snapeval.cache.snapstream import SnapStreamCache
from snapeval.cache.speculative_prefill import SpeculativePrefillCache
from snapeval.cache.streaming_llm import StreamingLLMCache
from snapeval.configs.setting import CacheSetting, effective_params

__all__ = [
    "CacheGrid",
    "CacheSetting",
    "FullCache",
    "SageKVCache",
    "SnapKVCache",
    "SnapStreamCache",
    "SnapevalCache",
    "SpeculativePrefillCache",
    "StreamingLLMCache",
    "build_cache",
    "effective_params",
    "install",
    "method_class",
    "method_classes",
]


def build_cache(setting: CacheSetting | Mapping[str, Any], strict: bool = True) -> SnapevalCache:
    """A new cache of ``setting``: a :class:`~snapeval.configs.setting.CacheSetting` (the plan's), or a
    node ``{"method": name, **parameters}`` (``name`` may be ``package.module:ClassName``). Unknown
    method names are errors. A node's unknown parameters are errors when ``strict``; otherwise they are
    dropped, so that one sweep can give ``budget`` to every method, the full cache included
    (:meth:`CacheSetting.of <snapeval.configs.setting.CacheSetting.of>`).
    """
    setting = CacheSetting.of(setting, strict)
    cache = method_class(setting.method)(**dict(setting.params))
    cache.method = setting.method  # an outside method is stored under the path that loads it again
    return cache
