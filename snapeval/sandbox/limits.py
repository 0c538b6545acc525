"""The resource limits of one program run, their defaults, and their checks when a config sets them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from snapeval.errors import SnapevalError

MIN_MEMORY_BYTES = 256 << 20
"""The smallest memory cap a config may set (per process or for all together): the LiveCodeBench
grader starts Python and numpy in 192 MiB of address space but not in 128 MiB (numpy's OpenBLAS
fails to allocate; measured on 2 cores, where it starts 2 threads: more cores take more)."""
MIN_PROCESSES = 2
"""The grader's process and the thread numpy's OpenBLAS starts beside it (1 fails numpy's import)."""
MIN_FILE_BYTES = 1 << 20
"""The smallest file-size cap and private disk: each test's output travels through a file, and a tmpfs
of size 0 would be unlimited."""
MAX_SECONDS = 86_400.0  # a day: more than any test needs; a typo such as 1e30 would overflow the alarm
MAX_COUNT = 2**63 - 1  # what setrlimit takes


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one program run.

    ``timeout_s`` bounds one run of :func:`~snapeval.sandbox.run_program`. LiveCodeBench grading
    (``livecodebench.run_tests``) runs all tests of a program in one run: there ``timeout_s`` bounds each
    test (the grader's alarm) and ``total_timeout_s`` the run; ``None`` means lcb_runner's
    ``(timeout + 1) * tests + 5`` seconds. ``address_space_bytes`` caps each process's address space
    (``RLIMIT_AS``); ``None`` sets no such cap (as lcb_runner), leaving ``total_memory_bytes`` (all
    processes together, a memory cgroup) as the only memory limit, or, where no cgroup can be made,
    each process's address space capped at ``total_memory_bytes``. A config's values are checked by
    :func:`limits_from_config`; built directly (tests, probes), they are taken as given.
    """

    timeout_s: float = 6.0
    total_timeout_s: float | None = None
    address_space_bytes: int | None = 1 << 30
    max_processes: int = 64
    max_file_bytes: int = 64 << 20
    max_disk_bytes: int = 128 << 20  # all files the program writes, together (namespaces only)
    total_memory_bytes: int = 2 << 30  # all its processes together (a root harness with cgroups)


DEFAULT_LIMITS = SandboxLimits()


_FLOORS: dict[str, tuple[float, str, bool]] = {
    "timeout_s": (0, "", False),
    "total_timeout_s": (0, "", True),
    "address_space_bytes": (MIN_MEMORY_BYTES, " (256 MiB: the grader needs about 192)", True),
    "max_processes": (MIN_PROCESSES, " (the grader and numpy's thread)", False),
    "max_file_bytes": (MIN_FILE_BYTES, " (1 MiB)", False),
    "max_disk_bytes": (MIN_FILE_BYTES, " (1 MiB; 0 would be no cap)", False),
    "total_memory_bytes": (MIN_MEMORY_BYTES, " (256 MiB: the grader needs about 192)", False),
}
"""Each field's floor, why, and whether it takes null; ``*_s`` fields take seconds, the others integers."""


def _takes(name: str, value: Any) -> str | None:
    """What field ``name`` takes, when ``value`` is not it (None: it is)."""
    low, why, optional = _FLOORS[name]
    if optional and value is None:
        return None
    or_null = " or null" if optional else ""
    if name.endswith("_s"):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and math.isfinite(value) and 0 < value <= MAX_SECONDS:
            return None
        return f"a number of seconds in (0, {MAX_SECONDS:g}]{or_null}"
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_COUNT:
        return None
    return f"an integer >= {int(low)}{why}{or_null}"


def limits_from_config(values: Any, field: str) -> SandboxLimits:
    """The limits a config node (``field``, e.g. ``task.sandbox``) sets, each value checked for its type and
    a floor below which no program runs; a bad one is refused in one line naming ``<field>.<name>``."""
    names = [item.name for item in fields(SandboxLimits)]
    if not isinstance(values, Mapping):
        raise SnapevalError(f"must be a mapping of {', '.join(names)}, got {values!r}", field)
    for name, value in values.items():
        if name not in _FLOORS:
            raise SnapevalError(f"unknown key {name!r}; SandboxLimits takes {', '.join(names)}", field)
        if (takes := _takes(name, value)) is not None:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise SnapevalError(f"must be {takes}, got {shown}", f"{field}.{name}")
    return SandboxLimits(**values)
