"""Hostile programs are contained, scored as failures, and leave the harness unharmed, wherever the
interpreter lives (the harness's own, or a venv under /tmp for the isolation tests; see
test_sandbox_locations.py for venvs in other places, graded end to end)."""

from __future__ import annotations

import os
import shutil
import site
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import snapeval
from snapeval import sandbox
from snapeval.errors import SnapevalError
from snapeval.sandbox import SandboxLimits, cgroups, execution, probe, run_program
from snapeval.sandbox.root import allowed_paths

PROJECT = Path(__file__).resolve().parents[1]
ISOLATION = sandbox.isolation()
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.namespaces, reason="unshare cannot create namespaces here: no network/pid/fs isolation"
)
protects_files = pytest.mark.skipif(
    not (ISOLATION.namespaces or ISOLATION.fresh_uids),
    reason="programs run as the harness's own user on a writable filesystem here",
)


def make_venv(path: Path) -> Path:
    """A real virtual environment at ``path`` that sees this interpreter's packages, snapeval among them,
    however they were installed (a venv, conda, the system's; editable or not); returns its ``python``.

    ``--system-site-packages`` would not do: from a venv's python it gives the base interpreter's
    packages. A ``.pth`` file adds snapeval's folder and this interpreter's site-packages, the latter
    through ``site.addsitedir`` so that their own ``.pth`` files (editable installs' hooks) run too."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    folders = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    hook = f"{Path(snapeval.__file__).parents[1]}\nimport site; list(map(site.addsitedir, {folders!r}))\n"
    (Path(purelib) / "_snapeval_test_parent.pth").write_text(hook)
    return python


@pytest.fixture(scope="module")
def tmp_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv under /tmp (pytest's base temp, behind 0700 parents): the sandbox's private /tmp must
    not hide it."""
    python = make_venv(tmp_path_factory.mktemp("venv-under-tmp") / "venv")
    assert str(python).startswith(tempfile.gettempdir() + "/")
    return python


@pytest.fixture(params=["harness", "tmp-venv"])
def where(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test with the harness's own interpreter, then as if snapeval ran from a venv under /tmp
    (its ``sys.executable`` and ``sys.prefix``: what the sandbox reads to bind the interpreter; the
    harness's ``sys.exec_prefix`` stays, as the sandbox must bind it too: the venv's packages are its)."""
    if request.param == "tmp-venv":
        python = request.getfixturevalue("tmp_venv")
        monkeypatch.setattr(sys, "executable", str(python))
        monkeypatch.setattr(sys, "prefix", str(python.parents[1]))
    sandbox.isolation.cache_clear()
    yield request.param
    sandbox.isolation.cache_clear()


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
        (
            ISOLATION.wrapper,
            "/no/such/python",
            r"\[Errno 2\] exec /no/such/python: No such file or directory",
        ),
    ],
    ids=["launcher-fails", "bootstrap-fails"],
)
def test_a_broken_sandbox_raises_instead_of_failing_the_program(
    wrapper: tuple[str, ...], interpreter: str, message: str
) -> None:
    broken = sandbox.Isolation(wrapper, ISOLATION.fresh_uids, interpreter)
    with pytest.raises(SnapevalError, match=f"sandbox setup failed: .*{message}"):
        execution.execute("print('never runs')", "", sandbox.DEFAULT_LIMITS, broken)


def test_infinite_loop_is_killed_at_the_timeout() -> None:
    result = run_program(PRINT_WORKDIR + "while True:\n    pass", limits=SandboxLimits(timeout_s=1))
    assert result.status == "timeout"
    assert_harness_unharmed(result.stdout.strip())


def test_4gib_allocation_hits_the_memory_limit(where: str) -> None:
    result = run_program("block = bytearray(4 * 1024**3)\nprint('allocated')")
    assert result.status == "memory"
    assert "allocated" not in result.stdout


def test_fork_bomb_is_contained(where: str) -> None:
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
def test_files_outside_the_working_directory_are_untouchable(canary: Path, where: str) -> None:
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
def test_scratch_writes_never_reach_the_host(where: str) -> None:
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
def test_no_network(where: str) -> None:
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
    if ISOLATION.namespaces or ISOLATION.fresh_uids:
        assert secret not in result.stdout + result.stderr


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A world-readable, world-writable folder, as a shared data or socket folder may be."""
    folder = Path(tempfile.mkdtemp(prefix="snapeval-test-open-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder)


@needs_namespaces
def test_a_program_cannot_read_the_expected_answers(open_folder: Path, where: str) -> None:
    """The cheat that passed real problems: look stdin up in the benchmark's data file. The program's
    root is an allow-list: data, project, results and home folders do not exist for it."""
    data = open_folder / "data.jsonl"
    data.write_text('{"input": "3 4\\n", "output": "7"}\n')
    data.chmod(0o644)
    hidden = [
        str(PROJECT / "README.md"),
        str(PROJECT / "snapeval"),
        str(open_folder),
        str(Path.home() / ".cache"),
    ]
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
        print(sorted(os.listdir({str(PROJECT)!r})) if os.path.isdir({str(PROJECT)!r}) else [])
        """
    )
    result = run_program(cheat, stdin="3 4\n")
    lines = result.stdout.splitlines()
    assert lines[0] == "no data 2"
    # the root holds the system's folders, the work and tmp folders, and the top folders of the paths
    # bound for the interpreter (wherever a clone's .venv lives: /work, /check, /home ...)
    interpreter_tops = {Path(p).parts[1] for p in allowed_paths(sys.executable)}
    assert set(eval(lines[1])) <= {"dev", "etc", "proc", "root", "tmp", "work", *interpreter_tops}
    assert lines[2] == "[False, False, False, False]"
    # the project's folder exists only as a parent of an interpreter inside it (a clone's .venv), empty
    # but for that: its other files do not
    inside = {
        Path(p).relative_to(PROJECT).parts[0]
        for p in (sys.prefix, sys.exec_prefix, sys.executable)
        if PROJECT in Path(p).parents
    }
    assert set(eval(lines[3])) == inside


@needs_namespaces
def test_filesystem_unix_sockets_are_unreachable(open_folder: Path, where: str) -> None:
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
def test_all_files_of_a_program_together_are_capped(where: str) -> None:
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
    limits = SandboxLimits(max_disk_bytes=64 << 20, address_space_bytes=2 << 30)
    written, errno = run_program(writer, limits=limits).stdout.split()
    assert int(written) <= 4 and errno == "28"  # ENOSPC


@pytest.fixture
def without_namespaces(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine as one where unshare cannot create namespaces."""
    root = os.geteuid() == 0
    monkeypatch.setattr(probe, "_candidate_wrappers", lambda: iter([((), root)]))
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
    assert len(uids) == 2 and not {"0", "65534"} & uids
    time.sleep(2.5)
    assert not marker.exists()


@pytest.mark.skipif(cgroups.memory_cgroup_root() is None, reason="no memory cgroup can be created here")
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
    assert (
        int(run_program(children, limits=SandboxLimits(total_memory_bytes=1 << 30, timeout_s=30)).stdout) <= 1
    )
    assert run_program(
        children, limits=SandboxLimits(total_memory_bytes=8 << 30, timeout_s=30)
    ).stdout.split() == ["4"]
    assert not list(cgroups.memory_cgroup_root().glob(f"snapeval-{os.getpid()}-*"))  # all removed


def test_programs_run_in_the_harness_interpreter_with_its_packages(where: str) -> None:
    """Grading never silently switches to another Python: the same interpreter, numpy importable."""
    probe = "import sys, numpy\nprint(sys.executable)\nprint(sys.version)"
    executable, version = run_program(probe).stdout.splitlines()[:2]
    assert (executable, version) == (sys.executable, sys.version.splitlines()[0])


def processes_by_uid() -> dict[int, int]:
    """How many live processes each real uid has."""
    counts: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            line = next(x for x in status.read_text().splitlines() if x.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        counts[int(line.split()[1])] = counts.get(int(line.split()[1]), 0) + 1
    return counts


FORK_EIGHT = program(
    """
    import os
    children = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        children.append(pid)
    print(sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 for pid in children))
    """
)


@pytest.mark.skipif(not ISOLATION.fresh_uids, reason="a uid per program needs a root harness")
def test_a_fork_bomb_leaves_the_program_beside_it_free_to_fork() -> None:
    """Two programs graded at once: one holds every process its limit allows; the other still forks,
    since each runs as a uid of its own (the kernel counts the process limit per uid)."""
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
    limits = SandboxLimits(timeout_s=5, max_processes=16)
    bombing = threading.Thread(target=run_program, args=(bomb,), kwargs={"limits": limits})
    bombing.start()
    try:
        for _ in range(200):
            full = [uid for uid, n in processes_by_uid().items() if uid != os.getuid() and n >= 16]
            if full:
                break
            time.sleep(0.05)
        assert full, "the bomb never reached its process limit"
        beside = run_program(FORK_EIGHT, limits=SandboxLimits(max_processes=16))
        assert (beside.status, beside.stdout) == ("ok", "8\n")
        assert processes_by_uid().get(full[0], 0) >= 16, "the bomb was still at its limit meanwhile"
    finally:
        bombing.join()


@pytest.mark.skipif(not ISOLATION.fresh_uids, reason="a uid per program needs a root harness")
def test_each_program_runs_as_a_uid_of_its_own() -> None:
    uids = [
        int(run_program("import os\nprint(os.getuid(), os.getgid())").stdout.split()[0]) for _ in range(3)
    ]
    assert len(set(uids)) == 3
    assert all(uid >= execution.FRESH_UID_BASE for uid in uids)


GRAB_1280_MIB = "block = bytearray(1280 << 20)\nprint('allocated')"


@pytest.mark.parametrize("cgroup", ["memory cgroup", "no cgroup"])
def test_without_an_address_space_cap_the_total_memory_cap_holds(
    cgroup: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``address_space_bytes=None`` (lcb_runner's official harness sets no such cap): 1.25 GiB fits
    under a 2 GiB total but not under the default 1 GiB address space, and a 512 MiB total still
    stops it: through the run's memory cgroup, or, where there is none, as each process's cap."""
    if cgroup == "no cgroup":
        monkeypatch.setattr(cgroups, "memory_cgroup_root", lambda: None)
    elif cgroups.memory_cgroup_root() is None:
        pytest.skip("no memory cgroup can be created here")
    assert run_program(GRAB_1280_MIB).status == "memory"
    uncapped = SandboxLimits(address_space_bytes=None, total_memory_bytes=2 << 30)
    assert run_program(GRAB_1280_MIB, limits=uncapped).stdout == "allocated\n"
    small_total = SandboxLimits(address_space_bytes=None, total_memory_bytes=512 << 20)
    result = run_program(GRAB_1280_MIB, limits=small_total)
    assert result.stdout == ""
    assert result.status == ("memory" if cgroup == "no cgroup" else "error")  # the OOM kill: unshare exits 1


@needs_namespaces
def test_a_failing_mount_is_named_with_its_path_and_errno() -> None:
    with pytest.raises(SnapevalError) as failed:
        run_program("print('never runs')", limits=SandboxLimits(max_disk_bytes=-1))
    message = str(failed.value)
    assert message.startswith("sandbox setup failed: OSError: [Errno 22] mount tmpfs on /")
    assert message.endswith("/work: Invalid argument")
    assert "\n" not in message and sandbox.UNSAFE_ENV not in message


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    sandbox.isolation.cache_clear()
    yield
    sandbox.isolation.cache_clear()


@needs_namespaces
def test_the_probe_reports_a_failing_setup_as_it_is(fresh_probe, monkeypatch: pytest.MonkeyPatch) -> None:
    """Namespaces work but a mount fails: that mount is the error, not advice to disable isolation;
    and a LiveCodeBench run stops at its config check, before any model loads."""
    from snapeval.configs.compose import compose_config
    from snapeval.run.plan import check_inputs

    monkeypatch.setattr(probe, "DEFAULT_LIMITS", SandboxLimits(max_disk_bytes=-1))
    with pytest.raises(
        SnapevalError, match=r"\[Errno 22\] mount tmpfs on /\S+/work: Invalid argument$"
    ) as failed:
        sandbox.isolation()
    assert sandbox.UNSAFE_ENV not in str(failed.value)
    with pytest.raises(SnapevalError, match=r"\[Errno 22\] mount tmpfs"):
        check_inputs(compose_config("task=livecodebench"))


def test_where_unshare_cannot_create_namespaces_its_reason_is_named(fresh_probe, monkeypatch) -> None:
    refusing = ("sh", "-c", "echo 'unshare: unshare failed: Operation not permitted' >&2; exit 1", "unshare")
    monkeypatch.setattr(probe, "_candidate_wrappers", lambda: iter([(refusing, True), ((), True)]))
    expected = (
        r"unshare cannot create the sandbox's namespaces here \(unshare: unshare failed: Operation not "
        rf"permitted\), so model-written code will not run; set {sandbox.UNSAFE_ENV}=1"
    )
    with pytest.raises(SnapevalError, match=expected) as refused:
        sandbox.isolation()
    assert refused.value.field == sandbox.UNSAFE_ENV


def test_an_interpreter_the_program_cannot_run_is_named(fresh_probe, tmp_path: Path, monkeypatch) -> None:
    """The probe runs the interpreter in the sandbox: one it cannot run is an error naming it."""
    missing = tmp_path / "gone" / "bin" / "python"
    monkeypatch.setattr(sys, "executable", str(missing))
    with pytest.raises(SnapevalError, match=rf"{missing}: No such file or directory"):
        sandbox.isolation()
