"""The files a ``+exp=aime_budget_sweep`` run executes, from config to stored row to figure, measured.

:func:`measure` runs the sweep (one problem, a tiny random-weight model, a few tokens) and then
``python -m snapeval.figures`` on its database, each in a fresh interpreter under :func:`record`:
a trace function notes every snapeval function that is called (module and class bodies, run at import,
do not count), and an audit hook notes every file of ``conf/`` that is opened. kvpress is hidden from
both commands, so the sweep leaves its kvpress points out whether or not the extra is installed and the
set is the same everywhere. What ran is the union of both commands. ``tests/test_readme.py`` compares it
with the numbered trace of ``docs/layout.md`` (every file, each once); ``python -m tests.trace`` prints
what ran (each file with the functions of it that ran) and how the documented list differs from it.
"""

from __future__ import annotations

import inspect
import json
import os
import runpy
import subprocess
import sys
import threading
from pathlib import Path
from types import CodeType, FrameType

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "snapeval"
CONF = ROOT / "conf"

#: An AIME-like problem long enough (about 300 tokens) that both budgets of the sweep evict.
PROBLEM = (
    " ".join(
        f"Let $a_{i}$ be the number of ordered pairs $(x, y)$ of positive integers with "
        f"$x + y = {i + 10}$ and $x$ dividing $y$."
        for i in range(12)
    )
    + " Find the sum $a_0 + a_1 + \\dots + a_{11}$."
)


def _is_function(code: CodeType, caller: FrameType | None) -> bool:
    """Whether ``code`` is a function's (not a module or class body, nor a comprehension inside one)."""
    if not code.co_flags & inspect.CO_OPTIMIZED:
        return False
    if code.co_name.startswith("<") and code.co_name != "<lambda>" and caller is not None:
        return bool(caller.f_code.co_flags & inspect.CO_OPTIMIZED)
    return True


def record(out: Path, module: str, argv: list[str]) -> None:
    """Run ``python -m <module> <argv>`` in this interpreter and write to ``out`` (JSON) the snapeval
    files whose functions ran and the ``conf/`` files opened, whatever way the command ends."""
    package, conf = str(PACKAGE) + os.sep, str(CONF) + os.sep
    codes: set[CodeType] = set()
    opened: set[str] = set()

    def trace(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if code.co_filename.startswith(package) and code not in codes and _is_function(code, frame.f_back):
            codes.add(code)

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str | os.PathLike):
            path = os.path.abspath(os.fspath(args[0]))
            if path.startswith(conf):
                opened.add(path)

    sys.modules["kvpress"] = None  # type: ignore[assignment]  # hidden: find_spec None, import fails
    sys.addaudithook(audit)
    threading.settrace(trace)
    sys.settrace(trace)
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
        functions: dict[str, set[str]] = {path: set() for path in opened}
        for code in codes:
            functions.setdefault(code.co_filename, set()).add(code.co_qualname)
        out.write_text(json.dumps({_relative(path): sorted(names) for path, names in functions.items()}))


def _relative(path: str) -> str:
    return Path(path).relative_to(ROOT).as_posix()


def _recorded(out: Path, module: str, *argv: str, env: dict[str, str]) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.trace", "--record", str(out), module, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


def measure(workdir: Path) -> dict[str, list[str]]:
    """The files (relative to the checkout) a one-problem ``+exp=aime_budget_sweep`` (kvpress hidden:
    its points left out) and its figures execute, each with the functions of it that ran (none for
    a config file)."""
    from tests.families import save_family

    model = save_family("llama", workdir / "model")
    data = workdir / "aime24.jsonl"
    data.write_text(json.dumps({"id": 1, "problem": PROBLEM, "answer": "42"}) + "\n")
    db = workdir / "trace.sqlite"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    sweep = _recorded(
        workdir / "sweep.json",
        "snapeval",
        "+exp=aime_budget_sweep",
        "run.limit=1",
        "run.progress=false",
        f"run.db={db}",
        f"model.pretrained={model}",
        "model.name=tiny-llama",
        "task.max_new_tokens=4",
        f"task.metadata.data_path={data}",
        env=env,
    )
    figures = _recorded(
        workdir / "figures.json", "snapeval.figures", f"--db={db}", f"--out={workdir / 'figures'}", env=env
    )
    both = sorted({*sweep, *figures})
    return {name: sorted({*sweep.get(name, ()), *figures.get(name, ())}) for name in both}


def main() -> None:
    if sys.argv[1:2] == ["--record"]:
        record(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
        return
    import tempfile

    from tests.test_readme import documented_trace, stated_trace_count, trace_difference

    with tempfile.TemporaryDirectory() as workdir:
        files = measure(Path(workdir))
    listed = documented_trace()
    print(f"executed: {len(files)} files; docs/layout.md lists {len(listed)} and says {stated_trace_count()}")
    for name, functions in files.items():
        print(f"{'listed' if name in listed else 'NEW   '}  {name}  {' '.join(functions)[:160]}")
    difference = trace_difference(listed, list(files))
    print(
        "\nAgainst docs/layout.md's numbered list:",
        {kind: names for kind, names in difference.items() if names},
    )


if __name__ == "__main__":
    main()
