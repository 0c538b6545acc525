"""One confined run of one program: its private folder, its launch and its result."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import snapeval.sandbox.processes as processes
from snapeval.errors import SnapevalError
from snapeval.sandbox.cgroups import memory_cgroup
from snapeval.sandbox.limits import SandboxLimits
from snapeval.sandbox.root import allowed_paths, work_folder

Status = Literal["ok", "error", "timeout", "memory", "killed"]

FRESH_UID_BASE = 1 << 24
"""A root harness runs each program as a uid of its own, drawn from here on."""

_PROGRAM_NAME = "main.py"
_STARTED = b"\0"
_BOOTSTRAP = (Path(__file__).parent / "bootstrap.py").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ExecutionResult:
    """What one program run did. ``returncode`` is the launcher's exit status: negative when a
    signal ended the program, but 1 when a namespaced program was SIGKILLed (``unshare``)."""

    status: Status
    stdout: str
    stderr: str
    returncode: int
    seconds: float
    network_isolated: bool


@dataclass(frozen=True)
class Isolation:
    """How programs are confined on this machine; see :func:`~snapeval.sandbox.isolation`.

    ``wrapper`` is the ``unshare`` command line (empty: no namespaces); ``fresh_uids``: each program
    runs as a uid of its own (a root harness), so that no two share a process limit or can signal
    each other.
    """

    wrapper: tuple[str, ...]
    fresh_uids: bool
    interpreter: str

    @property
    def namespaces(self) -> bool:
        """Private mount/net/pid/ipc namespaces and an allow-listed, read-only root."""
        return bool(self.wrapper)


class LauncherFailed(SnapevalError):
    """The launcher (``unshare``) failed before the sandbox's bootstrap started."""


def execute(code: str, stdin: str, limits: SandboxLimits, iso: Isolation) -> ExecutionResult:
    """Run the Python program ``code`` with ``stdin`` under ``iso``. Raises ``SnapevalError`` when the
    sandbox itself cannot be set up (never scored as a failing program)."""
    uid = FRESH_UID_BASE + secrets.randbelow(1 << 24) if iso.fresh_uids else None
    with (
        memory_cgroup(limits.total_memory_bytes) as cgroup,
        _private_workdir(code, uid) as workdir,
        tempfile.TemporaryFile() as stdin_file,
        tempfile.TemporaryFile() as stdout_file,
        tempfile.TemporaryFile() as stderr_file,
        _ReportPipe() as report,
    ):
        stdin_file.write(stdin.encode())
        stdin_file.seek(0)
        started = time.monotonic()
        proc = subprocess.Popen(
            _command(iso, uid, limits, workdir, report.write_fd, cgroup),
            stdin=stdin_file,
            stdout=stdout_file,
            stderr=stderr_file,
            cwd=workdir,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir)},
            start_new_session=True,
            pass_fds=(report.write_fd,),
        )
        timed_out = True  # until it exits in time: also kills it if the harness is interrupted
        try:
            report.close_write_end()
            timed_out = not processes.wait_for_exit(proc.pid, limits.timeout_s)
            seconds = time.monotonic() - started
        finally:
            returncode = processes.stop(proc, kill_namespace=timed_out and iso.namespaces)
            if uid is not None and not iso.namespaces:  # what it left running (a daemon) dies too
                processes.kill_user(uid)
        report.check(timed_out, returncode, stderr_file)
        stdout = _read(stdout_file, limits.max_file_bytes)
        stderr = _read(stderr_file, limits.max_file_bytes)
    status = "timeout" if timed_out else _status(returncode, stderr)
    return ExecutionResult(status, stdout, stderr, returncode, seconds, iso.namespaces)


@contextlib.contextmanager
def _private_workdir(code: str, uid: int | None) -> Iterator[Path]:
    """A fresh directory holding the program as ``main.py``, owned by ``uid``; deleted afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="snapeval-sandbox-")).resolve()
    try:
        (workdir / _PROGRAM_NAME).write_text(code, encoding="utf-8")
        if uid is not None:
            os.chown(workdir, uid, uid)
        yield workdir
    finally:
        _remove_tree(workdir)


def _command(
    iso: Isolation, uid: int | None, limits: SandboxLimits, workdir: Path, report_fd: int, cgroup: str | None
) -> list[str]:
    address_space = limits.address_space_bytes
    if address_space is None and cgroup is None:  # no cgroup: the total is the only cap there is
        address_space = limits.total_memory_bytes
    allowed = allowed_paths(iso.interpreter)
    settings = (
        report_fd,
        cgroup or "-",
        workdir,
        int(iso.namespaces),
        "-" if uid is None else uid,
        "-" if address_space is None else address_space,
        limits.max_processes,
        limits.max_file_bytes,
        int(limits.timeout_s) + 1,
        limits.max_disk_bytes,
        os.pathsep.join(allowed),
        work_folder(allowed),
        iso.interpreter,
    )
    return [*iso.wrapper, sys.executable, "-I", "-S", "-c", _BOOTSTRAP, *map(str, settings)]


class _ReportPipe:
    """The bootstrap's close-on-exec channel: ``_STARTED``, then an error message if setup fails."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def __enter__(self) -> _ReportPipe:
        return self

    def close_write_end(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def check(self, timed_out: bool, returncode: int, stderr: IO[bytes]) -> None:
        """Raise ``SnapevalError`` unless the bootstrap started and exec'd the program
        (:class:`LauncherFailed` when it never started)."""
        self.close_write_end()
        report = _read_all(self.read_fd)
        if report == _STARTED or (not report and timed_out):
            return
        stderr.seek(0)
        message = (report[len(_STARTED) :] or stderr.read(2000)).decode(errors="replace").strip()
        message = " / ".join(message.splitlines()) or f"launcher exit status {returncode}"
        raise (SnapevalError if report else LauncherFailed)(f"sandbox setup failed: {message}")

    def __exit__(self, *exc_info: object) -> None:
        self.close_write_end()
        os.close(self.read_fd)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _read(file: IO[bytes], max_bytes: int) -> str:
    file.seek(0)
    return file.read(max_bytes).decode(errors="replace")


def _status(returncode: int, stderr: str) -> Status:
    if returncode == 0:
        return "ok"
    if stderr.rstrip().rpartition("\n")[2].startswith("MemoryError"):
        return "memory"
    return "killed" if returncode < 0 else "error"


def _remove_tree(root: Path) -> None:
    """Delete ``root`` even if the program left unreadable directories in it (never follows links)."""
    os.chmod(root, 0o700)
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(root)
