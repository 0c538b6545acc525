"""Every numeric argument of every script in ``benchmarks/`` is checked as the package checks its own: a
bad one ends the script in one line ``error: <flag>: <what>`` with exit code 2, before any model is made,
never a traceback (``decode_step.py --rounds 0`` was a StatisticsError, ``--rows 0`` a SnapevalError shown
as a traceback, ``decode_attention.py --kv-heads 0`` a ZeroDivisionError).

Each case runs the script as ``python benchmarks/<script>.py <arguments>`` would, in this process
(:func:`runpy.run_path` as ``__main__``, ``benchmarks/`` on the path), so that torch loads once.
"""

from __future__ import annotations

import runpy
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
AT_LEAST_1 = "must be >= 1, got 0"

CASES = [
    ("decode_step", ["--rounds", "0"], f"--rounds: {AT_LEAST_1}"),
    ("decode_step", ["--rows", "0"], f"--rows: {AT_LEAST_1}"),
    ("decode_step", ["--rows", "4", "0"], f"--rows: {AT_LEAST_1}"),
    ("decode_step", ["--slots", "0"], f"--slots: {AT_LEAST_1}"),
    ("decode_step", ["--steps", "0"], f"--steps: {AT_LEAST_1}"),
    (
        "decode_step",
        ["--slots", "40"],
        "--slots: cache.budget: must be an integer larger than cache.window + cache.sinks + cache.ring = 46, "
        "got 40",
    ),
    ("decode_attention", ["--kv-heads", "0"], f"--kv-heads: {AT_LEAST_1}"),
    ("decode_attention", ["--kv-heads", "4"], "--kv-heads: must divide --heads (9), got 4"),
    *[
        ("decode_attention", [flag, "0"], f"{flag}: {AT_LEAST_1}")
        for flag in ("--rows", "--slots", "--heads", "--head-dim", "--repeats", "--calls", "--threads")
    ],
    ("engine", ["--lengths", "2048", "10"], "--lengths: must be >= 48, got 10"),
    *[
        ("engine", [flag, "0"], f"{flag}: {AT_LEAST_1}")
        for flag in ("--budgets", "--decode-tokens", "--repeats", "--threads")
    ],
    ("engine", ["--warmup", "-1"], "--warmup: must be >= 0, got -1"),
    ("engine", ["--seed", "-1"], "--seed: must be >= 0, got -1"),
    (
        "engine",
        ["--budgets", "40"],
        "--budgets: cache.budget: must be an integer larger than cache.sinks + cache.recent = 68, got 40",
    ),
    *[("gpu", [flag, "0"], f"{flag}: {AT_LEAST_1}") for flag in ("--contexts", "--budgets", "--full-rows")],
    ("gpu", ["--steps", "1"], "--steps: must be >= 2, got 1"),
    *[
        ("engines", [flag, "0"], f"{flag}: {AT_LEAST_1}")
        for flag in ("--prompts", "--max-new-tokens", "--concurrency", "--threads", "--server-threads")
    ],
    ("engines", ["--length", "100"], "--length: must be >= 256, got 100"),
    ("gpu", ["--steps", "5", "--profile", "profiles"], "--steps: must be >= 6 with --profile, got 5"),
    (
        "gpu",
        ["--budgets", "1024", "2048"],
        "--budgets: give one for every context or one per context, got 2 for 3 contexts",
    ),
    (
        "gpu",
        ["--contexts", "512", "--budgets", "4096", "--full-rows", "1"],
        "--budgets: must be at most the 1 full row(s) x 512 tokens it is compared with, got 4096",
    ),
    ("gpu", ["--budgets", "40"], "--budgets: cache.budget: must be an integer larger than"),
    *[
        ("grid", [flag, "0"], f"{flag}: {AT_LEAST_1}")
        for flag in ("--budgets", "--kernels", "--prompts", "--max-new-tokens", "--rows", "--threads")
    ],
    ("grid", ["--kernels", "4"], "--kernels: cache.kernel: must be a positive odd integer, got 4"),
    ("grid", ["--longbench-tokens", "-1"], "--longbench-tokens: must be >= 0, got -1"),
    (
        "grid",
        ["--longbench-tokens", "32"],
        "--longbench-tokens: must be 0 (no LongBench-v2) or more than --max-new-tokens (32), got 32",
    ),
    ("grid", ["--ruler-tokens", "10"], "--ruler-tokens: must be 0 (no RULER) or >= 48, got 10"),
    ("load_memory", ["--repeats", "0"], f"--repeats: {AT_LEAST_1}"),
    *[
        ("reselection", [flag, "0"], f"{flag}: {AT_LEAST_1}")
        for flag in ("--rows", "--prompt", "--budget", "--buffer", "--repeats", "--threads")
    ],
    ("reselection", ["--steps", "1"], "--steps: must be >= 2, got 1"),
    ("reselection", ["--buffer", "2"], "--buffer: cache.buffer: must be at least cache.window = 8, got 2"),
    *[
        ("throughput", [flag, "0"], f"{flag}: {AT_LEAST_1}")
        for flag in ("--problems", "--draws", "--rows", "--budget", "--threads")
    ],
    ("throughput", ["--max-new-tokens", "1"], "--max-new-tokens: must be >= 2, got 1"),
    ("throughput", ["--one-by-one", "-1"], "--one-by-one: must be >= 0, got -1"),
    ("throughput", ["--method", "nope"], "--method: cache.method: unknown method 'nope'; choose one of"),
    ("workers", ["--limit", "0"], f"--limit: {AT_LEAST_1}"),
    ("workers", ["--workers", "2", "0"], f"--workers: {AT_LEAST_1}"),
]


@pytest.fixture(scope="module")
def benchmarks_importable() -> Iterator[None]:
    """``benchmarks/`` first on the path, as for a script there; its modules forgotten afterwards."""
    sys.path.insert(0, str(BENCHMARKS))
    yield
    sys.path.remove(str(BENCHMARKS))
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(BENCHMARKS)):
            del sys.modules[name]


def run_script(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> object:
    """The exit code of ``python benchmarks/<name>.py <argv>``, run in this process."""
    script = BENCHMARKS / f"{name}.py"
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    return exit_.value.code


@pytest.mark.parametrize(
    ("script", "argv", "expected"), CASES, ids=[f"{script} {' '.join(argv)}" for script, argv, _ in CASES]
)
def test_a_bad_number_ends_in_one_line(script, argv, expected, benchmarks_importable, monkeypatch, capsys):
    assert run_script(script, argv, monkeypatch) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"error: {expected}"), err


def test_the_engine_refuses_a_markdown_file_that_is_a_database(
    tmp_path, benchmarks_importable, monkeypatch, capsys
):
    database = tmp_path / "results.sqlite"
    with sqlite3.connect(database) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = database.read_bytes()
    assert run_script("engine", ["--markdown", str(database)], monkeypatch) == 2
    expected = (
        f"error: --markdown: {database} is a SQLite database: writing it would destroy it; give another file"
    )
    assert capsys.readouterr().err == expected + "\n"
    assert database.read_bytes() == before
