"""Waiting for a program run and killing whatever is left of it."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from pathlib import Path

GRACE_S = 2.0


def wait_for_exit(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` exits, without reaping it. Returns False on timeout."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(max(timeout_s, 0.0) * 1000))
    finally:
        os.close(pidfd)


def stop(proc: subprocess.Popen[bytes], *, kill_namespace: bool) -> int:
    """Kill whatever is left of a run, reap it, and return the launcher's exit status.

    A timed-out namespace is stopped through its init, which ``unshare`` then reaps (the kernel
    kills every other process in it first); anything else left is killed by process group. The
    leader is reaped last, so its process group id cannot have been reused meanwhile.
    """
    if kill_namespace:
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        wait_for_exit(proc.pid, GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


def kill_user(uid: int) -> None:
    """SIGKILL every process of ``uid`` until none is left."""
    for _ in range(50):
        pids = []
        for status in Path("/proc").glob("[0-9]*/status"):
            with contextlib.suppress(OSError):
                line = next(x for x in status.read_text().splitlines() if x.startswith("Uid:"))
                if int(line.split()[1]) == uid:
                    pids.append(int(status.parent.name))
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # Fields after the command name, which may itself contain ") ": state, ppid, ...
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid:
                children.append(int(stat.parent.name))
    return children
