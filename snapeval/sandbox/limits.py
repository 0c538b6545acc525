"""The resource limits of one program run, and their defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one program run.

    ``timeout_s`` bounds one run of :func:`~snapeval.sandbox.run_program`. LiveCodeBench grading
    (``livecodebench.run_tests``) runs all tests of a program in one run: there ``timeout_s`` bounds each
    test (the grader's alarm) and ``total_timeout_s`` the run; ``None`` means lcb_runner's
    ``(timeout + 1) * tests + 5`` seconds. ``address_space_bytes`` caps each process's address space
    (``RLIMIT_AS``); ``None`` sets no such cap (as lcb_runner), leaving ``total_memory_bytes`` (all
    processes together, a memory cgroup) as the only memory limit, or, where no cgroup can be made,
    each process's address space capped at ``total_memory_bytes``.
    """

    timeout_s: float = 6.0
    total_timeout_s: float | None = None
    address_space_bytes: int | None = 1 << 30
    max_processes: int = 64
    max_file_bytes: int = 64 << 20
    max_disk_bytes: int = 128 << 20  # all files the program writes, together (namespaces only)
    total_memory_bytes: int = 2 << 30  # all its processes together (a root harness with cgroups)


DEFAULT_LIMITS = SandboxLimits()
