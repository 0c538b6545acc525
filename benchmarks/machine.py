"""The machine a benchmark ran on, and the peak memory of each of its runs (Linux, with fallbacks).

Shared by the benchmark scripts: ``cpu_model`` and ``available_cores`` head every table; ``PeakRss``
gives each row of ``engine.py`` its own peak resident set size.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import platform
import resource
import sys
from pathlib import Path

MIB = 2**20


class PeakRss:
    """Peak resident set size of this process.

    On Linux the kernel's high-water mark (VmHWM) is reset before every run, so each row shows its own
    peak; elsewhere it falls back to ``resource.getrusage`` (the peak over the whole process lifetime).
    """

    def __init__(self) -> None:
        self.resettable = _reset_high_water_mark()
        self.source = (
            "VmHWM from /proc/self/status, reset before each run via /proc/self/clear_refs"
            if self.resettable
            else "resource.getrusage ru_maxrss (peak over the process lifetime, never reset)"
        )

    def reset(self) -> None:
        """Start a new peak from the memory in use now, not from what earlier runs freed but kept."""
        gc.collect()
        _trim_heap()
        if self.resettable:
            _reset_high_water_mark()

    def mib(self) -> float:
        if self.resettable:
            return _status_kib("VmHWM") / 1024
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / MIB if sys.platform == "darwin" else peak / 1024


def _trim_heap() -> None:
    """Hand freed heap pages back to the OS where the C library can (glibc's ``malloc_trim``)."""
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:
        trim(0)


def _reset_high_water_mark() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
