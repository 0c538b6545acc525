"""A memory cgroup of its own for each program run: all its processes together under one cap."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[str | None]:
    """A memory cgroup of ``limit`` bytes (swap included) for one run: the path of its ``cgroup.procs``,
    which the bootstrap joins; None where the harness cannot create one (not root, no memory
    controller). Whatever is left in it is killed and the cgroup removed afterwards."""
    base = memory_cgroup_root()
    if base is None:
        yield None
        return
    group = base / f"snapeval-{os.getpid()}-{secrets.token_hex(4)}"
    group.mkdir()
    try:
        if (group / "memory.max").exists():  # cgroup v2
            (group / "memory.max").write_text(str(limit))
            (group / "memory.swap.max").write_text("0")
        else:
            (group / "memory.limit_in_bytes").write_text(str(limit))
            with contextlib.suppress(OSError):  # swap accounting may be off
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
        yield str(group / "cgroup.procs")
    finally:
        for _ in range(50):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.02)


@functools.cache
def memory_cgroup_root() -> Path | None:
    """Where this (root) harness can create memory cgroups: cgroup v1's memory hierarchy, or a cgroup
    v2 root that delegates the memory controller; None otherwise."""
    if os.geteuid() != 0:
        return None
    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    if (v1 / "memory.limit_in_bytes").exists() and os.access(v1, os.W_OK):
        return v1
    with contextlib.suppress(OSError):
        if "memory" in (v2 / "cgroup.subtree_control").read_text().split() and os.access(v2, os.W_OK):
            return v2
    return None
