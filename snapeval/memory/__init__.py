"""Memory estimator: KV-cache and weights bytes of a model on SN40L or GPU memory tiers.

``python -m snapeval.memory model=deepseek-r1 hardware=sn40l context=131072 tp=16 budget=32768``
prints the estimate as tables; :func:`estimate` returns it as a :class:`MemoryEstimate`.
"""

from snapeval.memory.catalogue import model_names, shipped_configs
from snapeval.memory.estimate import MemoryEstimate, TierFit, estimate
from snapeval.memory.geometry import ModelGeometry, geometry_from_config, load_geometry
from snapeval.memory.hardware import HardwareProfile, MemoryTier, hardware_names, load_hardware
from snapeval.memory.kv import kv_bytes_per_sequence, kv_bytes_per_token, method_names
from snapeval.memory.units import DTYPE_BYTES

__all__ = [
    "DTYPE_BYTES",
    "HardwareProfile",
    "MemoryEstimate",
    "MemoryTier",
    "ModelGeometry",
    "TierFit",
    "estimate",
    "geometry_from_config",
    "hardware_names",
    "kv_bytes_per_sequence",
    "kv_bytes_per_token",
    "load_geometry",
    "load_hardware",
    "method_names",
    "model_names",
    "shipped_configs",
]
