"""``engine.serve``: snapeval starts a deployed engine's server for each cache setting, waits for it, stores
what it is, and stops it, whatever ends the run.

The server is :mod:`tests.fake_engine` (an OpenAI-compatible stand-in, standard library only) and the
client lm-eval's real ``local-completions``: a grid of two budgets starts two servers on two ports, each
run stores its server's identity (and no key: ``OPENAI_API_KEY`` is set, and the server echoes it); no
server outlives a finished run, a failed one, Ctrl-C, SIGTERM, or a SIGKILLed parent; a server that exits
at once or never answers ends the run in one line with its log's last lines; a re-run after a server
died computes only the samples it lacks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from snapeval.backends.serve import ServedEngine
from snapeval.configs.backend import quote_arguments
from snapeval.configs.engine import check_engine
from snapeval.errors import SnapevalError
from snapeval.run import runner

from .conftest import compose_config

ROOT = Path(__file__).parent.parent
SERVE = f"{sys.executable} -m tests.fake_engine --port {{port}} --budget {{budget:-none}}"
BASE_URL = "base_url=http://127.0.0.1:{port}/v1/completions,model=fake,max_retries=1"
KEY = "sk-snapeval-test-3f9c2e7a1b"


def served_config(overrides: tuple[str, ...], db: Path, *extra: str, serve: str = SERVE) -> dict:
    return compose_config(
        *overrides,
        "model.backend=lm_eval:local-completions",
        f"model.backend_args={BASE_URL}",
        f"engine.serve={serve}",
        "run.limit=3",
        "task.context_length=512",
        "run.progress=false",
        f"run.db={db}",
        *extra,
    )


def logged_pids(folder: Path) -> list[int]:
    """The pid each fake engine printed first in its log under ``folder``."""
    logs = sorted((folder / "engine-logs").glob("*.log"))
    return [int(re.search(r"pid (\d+)", log.read_text())[1]) for log in logs]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(pid) for pid in pids)


def engines(db: Path) -> list[tuple[str, dict]]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT status, engine FROM runs ORDER BY id").fetchall()
    return [(status, json.loads(engine) if engine else None) for status, engine in rows]


@pytest.fixture(scope="module")
def grid_run(tiny_llama_overrides, tmp_path_factory):
    """A grid of two budgets served by two fake engines, with a key in the environment."""
    db = tmp_path_factory.mktemp("grid") / "served.db"
    cfg = served_config(
        tiny_llama_overrides, db, "+grid.cache=[streaming_llm]", "+grid.params.budget=[64,128]"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_API_KEY", KEY)
        summaries = runner.run(cfg)
    return db, summaries


def test_each_point_gets_its_own_server_on_its_own_port_stored_and_stopped(grid_run):
    db, summaries = grid_run
    assert [(s.n, s.accuracy, s.computed) for s in summaries] == [(3, 1.0, 3), (3, 1.0, 3)]
    stored = engines(db)
    assert [status for status, _ in stored] == ["finished", "finished"]
    ports = [int(re.search(r":(\d+)/v1/completions", engine["backend_args"])[1]) for _, engine in stored]
    assert len(set(ports)) == 2
    for (_, engine), port, budget in zip(stored, ports, (64, 128), strict=True):
        assert engine["serve"] == f"{sys.executable} -m tests.fake_engine --port {port} --budget {budget}"
        assert engine["backend"] == "lm_eval:local-completions"
        assert engine["models"]["data"][0]["id"] == "fake" and engine["version"] == "fake-1.0"
        assert engine["server"].startswith("BaseHTTP/")
        assert Path(engine["log"]).parent == db.parent / "engine-logs"
        assert f"port {port} budget {budget}" in Path(engine["log"]).read_text()
    assert gone(logged_pids(db.parent), within=0)


def test_no_key_reaches_the_database_even_when_a_server_echoes_it(grid_run):
    db, _ = grid_run
    [(_, engine), _] = engines(db)
    assert engine["models"]["data"][0]["authorization"] == "Bearer <$OPENAI_API_KEY>"  # sent, then blanked
    with sqlite3.connect(db) as connection:
        tables = [name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        cells = [
            str(cell)
            for table in tables
            for row in connection.execute(f"SELECT * FROM {table}")
            for cell in row
        ]
    assert len(cells) > 50 and not any(KEY in cell for cell in cells)
    for path in db.parent.glob(db.name + "*"):  # the database, and its write-ahead log if any
        assert KEY.encode() not in path.read_bytes(), path


def test_a_server_that_dies_mid_run_fails_it_and_a_re_run_computes_only_what_is_missing(
    tiny_llama_overrides, tmp_path
):
    db = tmp_path / "resumed.db"
    dying = served_config(tiny_llama_overrides, db, "run.batch_size=1", serve=SERVE + " --die-after 2")
    with pytest.raises(
        SnapevalError, match=r"^engine\.serve: the server exited \(code 3\) during the run; its log"
    ):
        runner.run(dying)
    assert [status for status, _ in engines(db)] == ["failed"]
    assert gone(logged_pids(tmp_path), within=0)
    [summary] = runner.run(served_config(tiny_llama_overrides, db, "run.batch_size=1"))
    assert (summary.n, summary.computed, summary.accuracy) == (3, 1, 1.0)
    assert [status for status, _ in engines(db)] == ["failed", "finished"]
    assert gone(logged_pids(tmp_path), within=0)


def test_a_server_that_never_answers_ends_the_run_in_one_line(tiny_llama_overrides, tmp_path):
    db = tmp_path / "silent.db"
    cfg = served_config(tiny_llama_overrides, db, "engine.ready_s=1", serve=SERVE + " --silent")
    with pytest.raises(SnapevalError) as info:
        runner.run(cfg)
    message = str(info.value)
    assert re.fullmatch(
        r"engine\.serve: the server did not answer http://127\.0\.0\.1:\d+/v1/models within 1 s "
        r"\(engine\.ready_s; it answered nothing\); its log's last lines \(\S+\.log\): "
        r"fake engine pid \d+ .*",
        message,
    ), message
    assert "\n" not in message and gone(logged_pids(tmp_path), within=0)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_the_server_and_closes_the_run(signum, tiny_llama_overrides, tmp_path):
    """The signal arrives while the server is answering (slowly): the run ends as interrupted, its
    server stopped before the exception leaves the runner."""
    db = tmp_path / "stopped.db"
    cfg = served_config(tiny_llama_overrides, db, serve=SERVE + " --slow 60")

    def signal_when_asked() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            logs = list((tmp_path / "engine-logs").glob("*.log"))
            if logs and "GET /version" in logs[0].read_text():  # ready, identity asked: a completion waits
                time.sleep(0.5)
                os.kill(os.getpid(), signum)
                return
            time.sleep(0.1)

    threading.Thread(target=signal_when_asked, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        runner.run(cfg)
    assert gone(logged_pids(tmp_path), within=0)
    assert [status for status, _ in engines(db)] == ["interrupted"]


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(monkeypatch, tmp_path):
    from snapeval.backends import serve

    monkeypatch.setattr(serve, "STOP_GRACE_S", 0.5)
    port = serve.free_port(set())
    command = [sys.executable, "-m", "tests.fake_engine", "--port", str(port), "--ignore-term"]
    engine = ServedEngine(command, f"http://127.0.0.1:{port}/v1/models", tmp_path / "e.log", 60)
    with engine:
        pid = engine.process.pid
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.3)
        assert alive(pid)  # it ignores SIGTERM
    assert not alive(pid) and engine.process.returncode == -signal.SIGKILL


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_sigkilled_parent_leaves_no_server(tmp_path):
    """snapeval killed with SIGKILL runs no cleanup at all: the kernel kills its server."""
    parent = f"""
import sys, time
from pathlib import Path
from snapeval.backends.serve import ServedEngine, free_port
port = free_port(set())
command = [sys.executable, "-m", "tests.fake_engine", "--port", str(port)]
with ServedEngine(command, f"http://127.0.0.1:{{port}}/v1/models", Path({str(tmp_path / "k.log")!r}), 60):
    print("ready", flush=True)
    time.sleep(120)
"""
    process = subprocess.Popen([sys.executable, "-c", parent], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    [pid] = [int(re.search(r"pid (\d+)", (tmp_path / "k.log").read_text())[1])]
    assert alive(pid)
    process.kill()
    process.wait()
    assert gone([pid])


def test_a_serve_command_that_exits_at_once_ends_the_command_in_one_line(tiny_llama_overrides, tmp_path):
    db = tmp_path / "refused.db"
    command = [
        sys.executable,
        "-m",
        "snapeval",
        *tiny_llama_overrides,
        "model.backend=lm_eval:local-completions",
    ]
    command += [f"model.backend_args={BASE_URL}", f"engine.serve={SERVE} --exit-at-once 7"]
    command += ["run.limit=2", "task.context_length=512", "run.progress=false", f"run.db={db}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(errors) == 1 and re.fullmatch(
        r"error: engine\.serve: the server exited \(code 7\) before answering; its log's last lines "
        r"\(\S+-run1\.log\): fake engine pid \d+ port \d+ budget none \| error: cannot load the model "
        r"\(a test's refusal\)",
        errors[0],
    ), done.stderr[-2000:]
    assert [status for status, _ in engines(db)] == ["failed"]


SERVED = ("model.backend=lm_eval:local-completions", f"model.backend_args={BASE_URL}")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            (f"engine.serve={SERVE} {{budgt}}", *SERVED),
            "engine.serve: unknown field {budgt}; a template takes {port}, {model}, {method}",
        ),
        (
            ("engine.serve=python -m x --port {port} --n {budget}", *SERVED),
            "engine.serve: {budget}: cache full has no budget; give a default",
        ),
        (("engine.serve=python -m x --port 8000", *SERVED), "engine.serve: the command takes no {port}"),
        (
            ("engine.serve=python -m x --port {port} --api-key=s", *SERVED),
            "engine.serve: --api-key passes a secret",
        ),
        (
            ("engine.serve=no-such-server --port {port}", *SERVED),
            "engine.serve: no program 'no-such-server' on PATH",
        ),
        (("engine.serve=python 'x {port}", *SERVED), "engine.serve: cannot split"),
        (
            ("engine.serve=python -m x --port {port:>5}", *SERVED),
            "engine.serve: '{port:>5}': a field is {name} or {name:-default}",
        ),
        (
            ("engine.serve=python -m x --port {port}",),
            "engine.serve: starts a deployed engine's server: give model.backend",
        ),
        (
            (
                "engine.serve=python -m x --port {port}",
                SERVED[0],
                "model.backend_args=base_url=http://h:80/v1,model=m",
            ),
            "model.backend_args: base_url must take {port}",
        ),
        (
            (SERVED[0], f"model.backend_args={BASE_URL}"),
            "model.backend_args: {port} is the port of a server snapeval starts",
        ),
    ],
)
def test_a_serve_template_that_cannot_run_is_refused_naming_its_field(overrides, expected):
    cfg = compose_config(*overrides)
    with pytest.raises(SnapevalError) as info:
        check_engine(cfg, [cfg["cache"]])
    assert str(info.value).startswith(expected), info.value


def test_a_grid_of_budgets_fills_each_servers_budget_and_the_full_cache_its_default():
    cfg = compose_config(
        *SERVED, f"engine.serve={SERVE}", "+grid.cache=[full,snapkv]", "+grid.params.budget=[64]"
    )
    check_engine(cfg, [{"method": "full"}, {"method": "snapkv", "budget": 64}])
    from snapeval.configs.engine import serve_command, serve_values

    command = serve_command(SERVE, serve_values(5, cfg, {"method": "full"}))
    assert command[-4:] == ["--port", "5", "--budget", "none"]
    assert serve_command(SERVE, serve_values(6, cfg, {"method": "snapkv", "budget": 64}))[-1] == "64"


def test_the_command_line_spellings_reach_the_config_unquoted():
    serve = "python -m llama_cpp.server --model /m/x.gguf --n_ctx 2048 --host 127.0.0.1 --port {port}"
    [quoted_serve, quoted_args] = quote_arguments([f"engine.serve={serve}", f"model.backend_args={BASE_URL}"])
    cfg = compose_config(*SERVED[:1], quoted_args, quoted_serve)
    assert (cfg["engine"]["serve"], cfg["model"]["backend_args"]) == (serve, BASE_URL)
    assert quote_arguments(["engine.serve=it's a\\"]) == ["engine.serve='it\\'s a\\\\'"]
    assert compose_config("engine.serve='it\\'s a\\\\'")["engine"]["serve"] == "it's a\\"
