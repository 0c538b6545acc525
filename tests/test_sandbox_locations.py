"""LiveCodeBench grades in the sandbox wherever snapeval's interpreter lives: a venv under /tmp, inside
the project's own tree (as ``python -m venv .venv`` in a clone), under a home directory, behind a
symlinked prefix, and the system's interpreter; the program sees neither the data nor the project."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapeval import sandbox
from tests.test_sandbox import PROJECT, make_venv

pytestmark = pytest.mark.skipif(
    not sandbox.isolation().namespaces, reason="unshare cannot create namespaces here: nothing is hidden"
)

GRADE = """
import json, sys
from snapeval.sandbox import isolation, run_program
hidden = json.loads(sys.argv[1])
spy = f'''import json, os, sys
hidden = {hidden!r}
listing = sorted(os.listdir(hidden[1])) if os.path.isdir(hidden[1]) else []
print(json.dumps([sys.executable, [os.path.exists(p) for p in hidden], listing]))
'''
executable, exists, listing = json.loads(run_program(spy).stdout)
graded = None
if len(sys.argv) < 3:  # the system's interpreter has none of snapeval's packages but the sandbox's
    from snapeval.tasks import livecodebench as lcb
    tests = [{"input": "3 4\\n", "output": "7\\n", "testtype": "stdin"}]
    problem = {"question_id": "q", "public_test_cases": json.dumps(tests), "metadata": "{}"}
    report = lcb.run_tests("a, b = map(int, input().split())\\nprint(a + b)\\n", problem)
    graded = [report.verdict, report.passed]
print(json.dumps({"namespaces": isolation().namespaces, "executable": executable, "exists": exists,
                  "project_listing": listing, "graded": graded}))
"""


@pytest.fixture
def data_file() -> Iterator[Path]:
    """A world-readable benchmark data file behind world-readable folders."""
    folder = Path(tempfile.mkdtemp(prefix="snapeval-test-data-"))
    folder.chmod(0o755)
    (folder / "test.jsonl").write_text('{"input": "3 4\\n", "output": "7\\n"}\n')
    (folder / "test.jsonl").chmod(0o644)
    yield folder / "test.jsonl"
    shutil.rmtree(folder)


@pytest.fixture
def scratch() -> Iterator[list[Path]]:
    """Folders to remove after the test (those outside pytest's tmp_path)."""
    made: list[Path] = []
    yield made
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def interpreter_at(place: str, tmp_path: Path, scratch: list[Path]) -> Path:
    if place == "tmp":
        return make_venv(tmp_path / "venv")
    if place == "project-tree":  # also under /work here: where the sandbox mounts its working folder
        folder = Path(tempfile.mkdtemp(prefix=".venv-test-", dir=PROJECT))
        scratch.append(folder)
        return make_venv(folder / ".venv")
    if place == "home":
        home = Path("/home") if os.access("/home", os.W_OK) else tmp_path / "home"
        home.mkdir(exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="snapeval-test-user-", dir=home))
        folder.chmod(0o700)  # as a home directory is
        scratch.append(folder)
        return make_venv(folder / ".venv")
    if place == "symlinked-prefix":
        real = make_venv(tmp_path / "real" / "venv")
        (tmp_path / "link").symlink_to(real.parents[1])
        return tmp_path / "link" / "bin" / "python"
    system = shutil.which("python3", path=os.defpath)
    if system is None:
        pytest.skip("no system python3")
    return Path(system)


@pytest.mark.parametrize("place", ["tmp", "project-tree", "home", "symlinked-prefix", "system"])
def test_livecodebench_grades_in_the_sandbox_wherever_the_interpreter_lives(
    place: str, tmp_path: Path, scratch: list[Path], data_file: Path
) -> None:
    python = interpreter_at(place, tmp_path, scratch)
    hidden = [str(data_file), str(PROJECT), str(PROJECT / "README.md"), str(PROJECT / "snapeval")]
    argv = [str(python), "-c", GRADE, json.dumps(hidden)]
    env = {k: v for k, v in os.environ.items() if k != sandbox.UNSAFE_ENV}
    if place == "system":  # snapeval's sandbox needs only the standard library
        argv.append("sandbox-only")
        env["PYTHONPATH"] = str(PROJECT)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["namespaces"] is True
    assert seen["executable"] == str(python)
    assert seen["exists"][0] is False and seen["exists"][2:] == [False, False]  # data, README, package
    if place == "project-tree":  # the venv's own parents exist (empty but for the venv), no more
        assert seen["project_listing"] == [scratch[0].name]
    else:
        assert seen["exists"][1] is False
    assert seen["graded"] in (None, ["passed", True])
    if place != "system":
        assert seen["graded"] == ["passed", True]
