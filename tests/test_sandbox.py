"""Hostile programs are contained, scored as failures, and leave the harness unharmed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapeval import sandbox
from snapeval.errors import SnapevalError
from snapeval.sandbox import SandboxLimits, run_program

ISOLATION = sandbox.isolation()
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.namespaces, reason="unshare cannot create namespaces here: no network/pid/fs isolation"
)
protects_files = pytest.mark.skipif(
    not (ISOLATION.namespaces or ISOLATION.uid is not None),
    reason="programs run as the harness's own user on a writable filesystem here",
)


def program(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


def processes_in(workdir: str) -> list[int]:
    """Live processes whose HOME is the sandbox working directory ``workdir``."""
    marker = f"HOME={workdir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def assert_harness_unharmed(workdir: str) -> None:
    """Nothing of the run is left: no process, no working directory; the harness can still fork."""
    assert workdir.startswith(os.path.realpath(tempfile.gettempdir()))
    assert processes_in(workdir) == []
    assert not Path(workdir).exists()
    assert subprocess.run([sys.executable, "-c", "pass"], timeout=30).returncode == 0


PRINT_WORKDIR = "import os\nprint(os.getcwd(), flush=True)\n"


def test_runs_a_program_on_its_stdin() -> None:
    result = run_program("print(sum(map(int, input().split())))", stdin="1 2 39\n")
    assert (result.status, result.stdout, result.returncode) == ("ok", "42\n", 0)
    assert result.network_isolated == ISOLATION.namespaces
    assert result.seconds < 5


def test_an_exception_is_an_error() -> None:
    result = run_program("raise ValueError('bad input')")
    assert (result.status, result.returncode) == ("error", 1)
    assert "ValueError: bad input" in result.stderr


def test_a_program_cannot_fake_a_broken_sandbox() -> None:
    forger = program(
        """
        import os
        for fd in range(3, 256):
            try:
                os.write(fd, b"sandbox setup failed")
            except OSError:
                pass
        raise SystemExit(125)
        """
    )
    result = run_program(forger)
    assert (result.status, result.returncode) == ("error", 125)


@pytest.mark.parametrize(
    ("wrapper", "interpreter", "message"),
    [
        (("false",), ISOLATION.interpreter, "launcher exit status 1"),
        (ISOLATION.wrapper, "/no/such/python", "exec /no/such/python: No such file or directory"),
    ],
    ids=["launcher-fails", "bootstrap-fails"],
)
def test_a_broken_sandbox_raises_instead_of_failing_the_program(
    wrapper: tuple[str, ...], interpreter: str, message: str
) -> None:
    broken = sandbox.Isolation(wrapper, ISOLATION.uid, interpreter)
    with pytest.raises(SnapevalError, match=f"sandbox setup failed: .*{message}"):
        sandbox._execute("print('never runs')", "", sandbox.DEFAULT_LIMITS, broken)


def test_infinite_loop_is_killed_at_the_timeout() -> None:
    result = run_program(PRINT_WORKDIR + "while True:\n    pass", limits=SandboxLimits(timeout_s=1))
    assert result.status == "timeout"
    assert 1 <= result.seconds < 3
    assert_harness_unharmed(result.stdout.strip())


def test_4gib_allocation_hits_the_memory_limit() -> None:
    result = run_program("block = bytearray(4 * 1024**3)\nprint('allocated')")
    assert result.status == "memory"
    assert "allocated" not in result.stdout


def test_fork_bomb_is_contained() -> None:
    bomb = program(
        """
        import os, time
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(1000)
        """
    )
    result = run_program(PRINT_WORKDIR + bomb, limits=SandboxLimits(timeout_s=2, max_processes=32))
    assert result.status == "timeout"
    assert result.seconds < 4
    assert_harness_unharmed(result.stdout.strip())


@needs_namespaces
def test_detached_children_die_with_the_program() -> None:
    escape = program(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(1000)
        print("parent exits")
        """
    )
    result = run_program(PRINT_WORKDIR + escape)
    workdir, message = result.stdout.splitlines()
    assert (result.status, message) == ("ok", "parent exits")
    assert_harness_unharmed(workdir)


def test_output_flood_is_bounded() -> None:
    result = run_program("while True:\n    print('x' * 4096)", limits=SandboxLimits(max_file_bytes=1 << 20))
    assert result.status == "error"
    assert "File too large" in result.stderr
    assert len(result.stdout) <= 1 << 20


@pytest.fixture(params=["harness-owned", "world-writable"])
def canary(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A file outside the sandbox. Not in pytest's tmp_path: its 0700 parents would deny any access
    and prove nothing. A world-writable file is protected only by the read-only filesystem view."""
    world_writable = request.param == "world-writable"
    if world_writable and not ISOLATION.namespaces:
        pytest.skip("no read-only filesystem view without namespaces")
    directory = Path(tempfile.mkdtemp(prefix="snapeval-canary-"))
    directory.chmod(0o777 if world_writable else 0o755)
    canary = directory / "canary.txt"
    canary.write_text("precious")
    canary.chmod(0o666 if world_writable else 0o644)
    yield canary
    shutil.rmtree(directory)


@protects_files
def test_files_outside_the_working_directory_are_untouchable(canary: Path) -> None:
    attack = program(
        f"""
        import os
        def attempt(name, action):
            try:
                action()
                print(name, "done")
            except OSError as exc:
                print(name, "denied", exc.errno)
        attempt("delete", lambda: os.remove({str(canary)!r}))
        attempt("overwrite", lambda: open({str(canary)!r}, "w").write("pwned"))
        attempt("create", lambda: open({str(canary.with_name("new.txt"))!r}, "w").write("pwned"))
        attempt("own-dir", lambda: open("scratch.txt", "w").write("mine"))
        print(os.getcwd())
        """
    )
    result = run_program(attack)
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [
        ["delete", "denied"],
        ["overwrite", "denied"],
        ["create", "denied"],
        ["own-dir", "done"],
    ]
    assert canary.read_text() == "precious"
    assert sorted(p.name for p in canary.parent.iterdir()) == ["canary.txt"]
    assert not Path(lines[4]).exists(), "the private working directory is deleted afterwards"


@needs_namespaces
def test_shared_scratch_directories_are_read_only() -> None:
    name = f"snapeval-escape-{os.getpid()}"
    attack = program(
        f"""
        for directory in ("/tmp", "/var/tmp", "/dev/shm"):
            try:
                open(f"{{directory}}/{name}", "w").write("x")
                print(directory, "written")
            except OSError as exc:
                print(directory, "denied", exc.errno)
        """
    )
    result = run_program(attack)
    assert result.stdout.split() == [
        "/tmp",
        "denied",
        "30",
        "/var/tmp",
        "denied",
        "30",
        "/dev/shm",
        "denied",
        "30",
    ]
    assert not any(Path(d, name).exists() for d in ("/tmp", "/var/tmp", "/dev/shm"))


@needs_namespaces
def test_no_network() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        attack = program(
            f"""
            import socket
            for address in (("127.0.0.1", {port}), ("1.1.1.1", 53)):
                try:
                    socket.create_connection(address, timeout=1).close()
                    print("connected")
                except OSError as exc:
                    print("failed", exc.errno)
            """
        )
        result = run_program(attack)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.network_isolated
    assert result.stdout.split() == ["failed", "101", "failed", "101"]  # ENETUNREACH: no interfaces up


def test_the_harness_environment_is_invisible(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "hunter2-b5f1c0de"
    monkeypatch.setenv("SNAPEVAL_TEST_SECRET", secret)
    spy = program(
        f"""
        import os
        print(sorted(os.environ))
        try:
            print(open("/proc/{os.getpid()}/environ").read())
        except OSError as exc:
            print("denied", exc.errno)
        """
    )
    result = run_program(spy)
    assert result.status == "ok"
    assert result.stdout.splitlines()[0] == "['HOME', 'LANG', 'PATH']"
    if ISOLATION.namespaces or ISOLATION.uid is not None:
        assert secret not in result.stdout + result.stderr
