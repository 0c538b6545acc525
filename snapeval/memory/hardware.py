"""Hardware profiles: the memory tiers of one socket, read from ``conf/hardware/<name>.yaml``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from snapeval.errors import SnapevalError
from snapeval.memory.units import parse_size
from snapeval.paths import CONF_DIR

HARDWARE_DIR = CONF_DIR / "hardware"
TIER_NAMES = ("onchip", "hbm", "ddr")


@dataclass(frozen=True)
class MemoryTier:
    """One memory level of a socket: ``onchip``, ``hbm`` or ``ddr``."""

    name: str
    label: str
    capacity: int


@dataclass(frozen=True)
class HardwareProfile:
    """One socket (chip) and the layout assumptions the estimate makes about it."""

    name: str
    sockets_per_node: int
    tiers: tuple[MemoryTier, ...]
    onchip_kv_fraction: float
    mla_latent_sharded: bool

    def tier(self, name: str) -> MemoryTier | None:
        """The tier called ``name``, or None if this hardware has no such tier."""
        return next((tier for tier in self.tiers if tier.name == name), None)


def hardware_names() -> list[str]:
    """The profiles in ``conf/hardware/``."""
    return sorted(path.stem for path in HARDWARE_DIR.glob("*.yaml"))


def load_hardware(name: str) -> HardwareProfile:
    """The profile ``conf/hardware/<name>.yaml``."""
    if name not in hardware_names():
        raise SnapevalError(
            f"unknown hardware {name!r}; choose one of {', '.join(hardware_names())}", "hardware"
        )
    with (HARDWARE_DIR / f"{name}.yaml").open() as stream:
        return hardware_from_dict(name, yaml.safe_load(stream))


def hardware_from_dict(name: str, data: Mapping[str, Any]) -> HardwareProfile:
    """The profile ``name`` from its YAML fields; a missing or bad field is named in the error."""
    tiers = data.get("tiers") or {}
    unknown = set(tiers) - set(TIER_NAMES)
    if unknown:
        raise SnapevalError(f"unknown tiers {sorted(unknown)}; choose from {', '.join(TIER_NAMES)}", "tiers")
    if "hbm" not in tiers:
        raise SnapevalError("an hbm tier is required: it holds the weights", "tiers")
    assumptions = data.get("assumptions") or {}
    fraction = assumptions.get("onchip_kv_fraction", 0.5)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise SnapevalError(f"must be in (0, 1], got {fraction!r}", "assumptions.onchip_kv_fraction")
    sockets = data.get("sockets_per_node", 1)
    if isinstance(sockets, bool) or not isinstance(sockets, int) or sockets <= 0:
        raise SnapevalError(f"must be a positive integer, got {sockets!r}", "sockets_per_node")
    return HardwareProfile(
        name=name,
        sockets_per_node=sockets,
        tiers=tuple(_tier(tier, tiers[tier]) for tier in TIER_NAMES if tier in tiers),
        onchip_kv_fraction=float(fraction),
        mla_latent_sharded=bool(assumptions.get("mla_latent_sharded", False)),
    )


def _tier(name: str, fields: Mapping[str, Any]) -> MemoryTier:
    capacity = parse_size(fields.get("capacity"), f"tiers.{name}.capacity")
    return MemoryTier(name=name, label=fields.get("label", name), capacity=capacity)
