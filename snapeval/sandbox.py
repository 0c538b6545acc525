"""Run untrusted (model-written) Python programs, each in its own confined process.

Every program gets a fresh private working directory (deleted afterwards), a scrubbed environment
(``PATH``, ``LANG`` and a ``HOME`` inside that directory), resource limits (address space,
processes, file size, CPU time, no core dumps) and a wall-clock timeout, after which it is killed
with every process it started. Where the platform allows it (probed once, see :func:`isolation`)
the program also runs

* in private mount, network, pid and IPC namespaces: no network at all (not even loopback), a
  private ``/proc``, and every process it starts dies with it;
* on a read-only view of the whole filesystem except its working directory;
* without capabilities and with ``no_new_privs`` (setuid binaries cannot raise privileges);
* as the unprivileged uid ``nobody`` when the harness runs as root, so that the process limit
  applies (the kernel exempts root from it).

The limits and namespaces are applied by a small bootstrap (:data:`_BOOTSTRAP`) that runs between
``unshare`` and the program's interpreter; it reports setup failures through a close-on-exec pipe,
so that a broken sandbox raises :class:`~snapeval.errors.SnapevalError` instead of being scored
as a failing program, and no program can fake such a failure.

Longer than 350 lines: one security boundary, kept in one file to be read and reviewed whole.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from snapeval.errors import SnapevalError

Status = Literal["ok", "error", "timeout", "memory", "killed"]

SANDBOX_UID = 65534
"""The uid (``nobody``) programs run as when the harness runs as root."""

UNSAFE_ENV = "SNAPEVAL_UNSAFE_SANDBOX"
"""Set to 1 to run model-written code where no namespace isolation is available (unsafe)."""

_FRESH_UID_BASE = 1 << 24
"""Without namespaces, a root harness runs each program as a uid of its own from here on."""

_PROGRAM_NAME = "main.py"
_NAMESPACE_FLAGS = ("--mount", "--net", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc")
_STARTED = b"\0"
_GRACE_S = 2.0

_BOOTSTRAP = (Path(__file__).parent / "sandbox_bootstrap.py").read_text(encoding="utf-8")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one program run.

    ``timeout_s`` bounds one run of :func:`run_program`. LiveCodeBench grading
    (``livecodebench.run_tests``) runs all tests of a program in one run: there ``timeout_s`` bounds each
    test (the grader's alarm) and ``total_timeout_s`` the run; ``None`` means lcb_runner's
    ``(timeout + 1) * tests + 5`` seconds.
    """

    timeout_s: float = 6.0
    total_timeout_s: float | None = None
    memory_bytes: int = 1 << 30
    max_processes: int = 64
    max_file_bytes: int = 64 << 20
    max_disk_bytes: int = 128 << 20  # all files the program writes, together (namespaces only)
    total_memory_bytes: int = 2 << 30  # all its processes together (a root harness with cgroups)


DEFAULT_LIMITS = SandboxLimits()


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
    """How programs are confined on this machine; see :func:`isolation`."""

    wrapper: tuple[str, ...]
    uid: int | None
    interpreter: str

    @property
    def namespaces(self) -> bool:
        """Private mount/net/pid/ipc namespaces and a read-only filesystem."""
        return bool(self.wrapper)


def run_program(code: str, stdin: str = "", limits: SandboxLimits = DEFAULT_LIMITS) -> ExecutionResult:
    """Run the Python program ``code`` with ``stdin`` under the strongest available isolation."""
    return _execute(code, stdin, limits, isolation())


@functools.cache
def isolation() -> Isolation:
    """Probe (once) the strongest isolation that works here, trying in order:

    1. as root: ``unshare`` namespaces and uid ``nobody``;
    2. ``unshare`` inside an unprivileged user namespace (programs keep the harness's uid);
    3. resource limits only, and only with :data:`UNSAFE_ENV` set (as root, each program then runs as
       a fresh uid whose processes are all killed when it ends).

    Programs always run in the interpreter snapeval runs in (``sys.executable``, with its
    site-packages): a machine where the sandbox cannot run it is an error, never another Python.
    """
    for wrapper, uid in _candidate_wrappers():
        candidate, works = _unless_unsafe(Isolation(wrapper, uid, sys.executable)), False
        with contextlib.suppress(SnapevalError):
            probe = "import os, sys; sys.exit(0 if os.access(sys.executable, os.X_OK) else 1)"
            works = _execute(probe, "", DEFAULT_LIMITS, candidate).status == "ok"
        if works:
            return candidate
    raise SnapevalError(
        f"the sandbox cannot run this interpreter ({sys.executable}) on this machine; model-written code "
        "is graded only by the interpreter snapeval runs in"
    )


def _unless_unsafe(candidate: Isolation) -> Isolation:
    """``candidate``, unless it has no namespaces and the user has not allowed that (:data:`UNSAFE_ENV`)."""
    if candidate.namespaces or os.environ.get(UNSAFE_ENV) == "1":
        return candidate
    raise SnapevalError(
        "unshare cannot create the sandbox's namespaces here, so model-written code will not run; "
        f"set {UNSAFE_ENV}=1 to run it anyway, without isolation (unsafe: it can read your files, "
        "reach the network and outlive the run)",
        UNSAFE_ENV,
    )


def _candidate_wrappers() -> Iterator[tuple[tuple[str, ...], int | None]]:
    root = os.geteuid() == 0
    unshare = shutil.which("unshare")
    if unshare and root:
        yield (unshare, *_NAMESPACE_FLAGS), SANDBOX_UID
    if unshare:
        yield (unshare, "--user", "--map-root-user", *_NAMESPACE_FLAGS), None
    yield (), SANDBOX_UID if root else None


def _execute(code: str, stdin: str, limits: SandboxLimits, iso: Isolation) -> ExecutionResult:
    uid = iso.uid if iso.namespaces or iso.uid is None else _FRESH_UID_BASE + secrets.randbelow(1 << 24)
    with (
        _memory_cgroup(limits.total_memory_bytes) as cgroup,
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
            timed_out = not _wait_for_exit(proc.pid, limits.timeout_s)
            seconds = time.monotonic() - started
        finally:
            returncode = _stop(proc, kill_namespace=timed_out and iso.namespaces)
            if uid != iso.uid:  # a fresh uid: whatever it left running (a detached daemon) dies too
                _kill_user(uid)
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
    settings = (
        report_fd,
        cgroup or "-",
        workdir,
        int(iso.namespaces),
        "-" if uid is None else uid,
        limits.memory_bytes,
        limits.max_processes,
        limits.max_file_bytes,
        int(limits.timeout_s) + 1,
        limits.max_disk_bytes,
        os.pathsep.join(_allowed_paths(iso.interpreter)),
        iso.interpreter,
    )
    return [*iso.wrapper, sys.executable, "-I", "-S", "-c", _BOOTSTRAP, *map(str, settings)]


@contextlib.contextmanager
def _memory_cgroup(limit: int) -> Iterator[str | None]:
    """A memory cgroup of ``limit`` bytes (swap included) for one run: the path of its ``cgroup.procs``,
    which the bootstrap joins; None where the harness cannot create one (not root, no memory
    controller). Whatever is left in it is killed and the cgroup removed afterwards."""
    base = _memory_cgroup_root()
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
def _memory_cgroup_root() -> Path | None:
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


def _allowed_paths(interpreter: str) -> list[str]:
    """What a confined program may see (read-only): the system's programs and libraries, and the
    interpreter with its standard library and site-packages (a virtual environment and its base)."""
    system = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache"]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    interpreters = {os.path.dirname(interpreter), os.path.dirname(os.path.realpath(interpreter))}
    python = sorted({os.path.realpath(p) for p in prefixes | interpreters} | prefixes | interpreters)
    covered = [p for p in python if not any(p.startswith(f"{s}/") or p == s for s in system)]
    return system + [p for p in covered if not any(p.startswith(f"{o}/") for o in covered if o != p)]


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
        """Raise ``SnapevalError`` unless the bootstrap started and exec'd the program."""
        self.close_write_end()
        report = _read_all(self.read_fd)
        if report == _STARTED or (not report and timed_out):
            return
        stderr.seek(0)
        message = (report[len(_STARTED) :] or stderr.read(2000)).decode(errors="replace").strip()
        raise SnapevalError(f"sandbox setup failed: {message or f'launcher exit status {returncode}'}")

    def __exit__(self, *exc_info: object) -> None:
        self.close_write_end()
        os.close(self.read_fd)


def _wait_for_exit(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` exits, without reaping it. Returns False on timeout."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(max(timeout_s, 0.0) * 1000))
    finally:
        os.close(pidfd)


def _stop(proc: subprocess.Popen[bytes], *, kill_namespace: bool) -> int:
    """Kill whatever is left of a run, reap it, and return the launcher's exit status.

    A timed-out namespace is stopped through its init, which ``unshare`` then reaps (the kernel
    kills every other process in it first); anything else left is killed by process group. The
    leader is reaped last, so its process group id cannot have been reused meanwhile.
    """
    if kill_namespace:
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        _wait_for_exit(proc.pid, _GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


def _kill_user(uid: int) -> None:
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
