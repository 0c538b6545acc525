"""Hostile programs are contained, scored as failures, and leave the harness unharmed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
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


PRINT_WORKDIR = 'import os\nprint(os.environ["HOME"], flush=True)  # the host folder of the run\n'


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
        print(os.environ["HOME"])
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
def test_scratch_writes_never_reach_the_host() -> None:
    """The program's /tmp is its own (a small tmpfs); the host's scratch folders do not exist for it."""
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
    assert result.stdout.split() == ["/tmp", "written", "/var/tmp", "denied", "2", "/dev/shm", "denied", "2"]
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


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A world-readable, world-writable folder, as a shared data or socket folder may be."""
    folder = Path(tempfile.mkdtemp(prefix="snapeval-test-open-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder)


@needs_namespaces
def test_a_program_cannot_read_the_expected_answers(open_folder: Path) -> None:
    """The cheat that passed real problems: look stdin up in the benchmark's data file. The program's
    root is an allow-list: data, project, results and home folders do not exist for it."""
    data = open_folder / "data.jsonl"
    data.write_text('{"input": "3 4\\n", "output": "7"}\n')
    data.chmod(0o644)
    hidden = [str(Path(__file__).resolve().parents[1]), str(open_folder), str(Path.home() / ".cache")]
    cheat = program(
        f"""
        import json, os, sys
        wanted = sys.stdin.read()
        try:
            rows = [json.loads(line) for line in open({str(data)!r})]
            print(next(row["output"] for row in rows if row["input"] == wanted))
        except OSError as exc:
            print("no data", exc.errno)
        print(sorted(os.listdir("/")))
        print([os.path.exists(p) for p in {hidden!r}])
        """
    )
    result = run_program(cheat, stdin="3 4\n")
    lines = result.stdout.splitlines()
    assert lines[0] == "no data 2"
    assert set(eval(lines[1])) <= {
        "bin",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "root",
        "sbin",
        "tmp",
        "usr",
        "work",
        "home",
        "opt",
    }
    assert lines[2] == "[False, False, False]"


@needs_namespaces
def test_filesystem_unix_sockets_are_unreachable(open_folder: Path) -> None:
    path = open_folder / "listener.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        path.chmod(0o777)
        listener.listen()
        listener.settimeout(0.5)
        attack = program(
            f"""
            import socket
            try:
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                client.connect({str(path)!r})
                client.sendall(b"leaked")
                print("connected")
            except OSError as exc:
                print("refused", exc.errno)
            """
        )
        result = run_program(attack)
        assert result.stdout.split()[0] == "refused"
        with pytest.raises(TimeoutError):
            listener.accept()


@needs_namespaces
def test_another_running_programs_folder_is_invisible() -> None:
    import threading

    before = set(Path(tempfile.gettempdir()).glob("snapeval-sandbox-*"))
    first = threading.Thread(
        target=run_program, args=("import time\nopen('secret', 'w').write('s')\ntime.sleep(3)",)
    )
    first.start()
    try:
        for _ in range(100):
            running = set(Path(tempfile.gettempdir()).glob("snapeval-sandbox-*")) - before
            if running:
                break
            threading.Event().wait(0.05)
        folder = running.pop()
        spy = program(
            f"""
            import os
            try:
                print(os.listdir({str(folder)!r}))
            except OSError as exc:
                print("hidden", exc.errno)
            """
        )
        assert run_program(spy).stdout.split() == ["hidden", "2"]
    finally:
        first.join()


@needs_namespaces
def test_all_files_of_a_program_together_are_capped() -> None:
    """Many files each under the per-file limit: the folder's tmpfs fills at max_disk_bytes."""
    writer = program(
        """
        written = 0
        try:
            for index in range(20):
                with open(f"part{index}", "wb") as f:
                    f.write(b"x" * (16 << 20))
                written += 1
        except OSError as exc:
            print(written, exc.errno)
        """
    )
    limits = SandboxLimits(max_disk_bytes=64 << 20, memory_bytes=2 << 30)
    written, errno = run_program(writer, limits=limits).stdout.split()
    assert int(written) <= 4 and errno == "28"  # ENOSPC


@pytest.fixture
def without_namespaces(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine as one where unshare cannot create namespaces."""
    root = os.geteuid() == 0
    monkeypatch.setattr(
        sandbox, "_candidate_wrappers", lambda: iter([((), sandbox.SANDBOX_UID if root else None)])
    )
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    sandbox.isolation.cache_clear()
    yield
    sandbox.isolation.cache_clear()


def test_without_namespaces_model_code_is_refused_unless_allowed(without_namespaces, monkeypatch) -> None:
    with pytest.raises(SnapevalError, match=f"set {sandbox.UNSAFE_ENV}=1") as refused:
        run_program("print('hi')")
    assert refused.value.field == sandbox.UNSAFE_ENV and "\n" not in str(refused.value)
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    if SYSTEM_PYTHON is not None:  # see below: an interpreter that any uid can run
        monkeypatch.setattr(sys, "executable", SYSTEM_PYTHON)
    sandbox.isolation.cache_clear()
    assert run_program("print('hi')").stdout == "hi\n"
    assert not sandbox.isolation().namespaces


SYSTEM_PYTHON = shutil.which("python3", path=os.defpath)


@pytest.mark.skipif(os.geteuid() != 0, reason="a fresh uid per program needs a root harness")
@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system python3 that any uid can run")
def test_without_namespaces_each_program_is_its_own_user_and_leaves_nothing_running(
    without_namespaces, monkeypatch, open_folder: Path
) -> None:
    # without an allow-listed root, a fresh uid cannot reach an interpreter in root's home: run this
    # harness as if it were the system's python3
    monkeypatch.setattr(sys, "executable", SYSTEM_PYTHON)
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    marker = open_folder / "daemon-was-here"
    daemon = program(
        f"""
        import os, time
        print(os.getuid(), flush=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1.5)
                open({str(marker)!r}, "w").write("late")
            os._exit(0)
        """
    )
    uids = {run_program(daemon).stdout.strip() for _ in range(2)}
    assert len(uids) == 2 and str(sandbox.SANDBOX_UID) not in uids
    time.sleep(2.5)
    assert not marker.exists()


@pytest.mark.skipif(sandbox._memory_cgroup_root() is None, reason="no memory cgroup can be created here")
def test_all_processes_of_a_program_together_are_capped_in_memory() -> None:
    """Four children of 600 MiB each, every one under the per-process limit: the run's memory cgroup
    (1 GiB here) lets at most one of them live; with room for all four, all four do."""
    children = program(
        """
        import os, time
        pids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                block = bytearray(600 << 20)
                time.sleep(1.0)  # all four hold their memory at once
                os._exit(0)
            pids.append(pid)
        print(sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 for pid in pids))
        """
    )
    assert int(run_program(children, limits=SandboxLimits(total_memory_bytes=1 << 30)).stdout) <= 1
    assert run_program(children, limits=SandboxLimits(total_memory_bytes=8 << 30)).stdout.split() == ["4"]
    assert not list(sandbox._memory_cgroup_root().glob(f"snapeval-{os.getpid()}-*"))  # all removed


def test_programs_run_in_the_harness_interpreter_with_its_packages() -> None:
    """Grading never silently switches to another Python: the same interpreter, numpy importable."""
    probe = "import sys, numpy\nprint(sys.executable)\nprint(sys.version)"
    executable, version = run_program(probe).stdout.splitlines()[:2]
    assert (executable, version) == (sys.executable, sys.version.splitlines()[0])
