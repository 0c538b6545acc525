"""Many workers on one results database: claims split a point's samples, a dead worker's claims return,
stale runs show, SIGTERM and SIGKILL lose nothing, shards fill one point, and a sweep runs with Hydra's
joblib launcher on a real PostgreSQL server (pgserver, on a Unix socket inside the test's folder)."""

from __future__ import annotations

import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import types
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import event, func, select

from snapeval.__main__ import check_before_hydra
from snapeval.cli import report
from snapeval.configs.compose import compose_config
from snapeval.configs.grid import grid_points
from snapeval.configs.setting import CacheSetting
from snapeval.errors import SnapevalError
from snapeval.results import ResultsDB, config_hash
from snapeval.results.leases import needing_attention
from snapeval.results.schema import claims, runs, samples
from snapeval.run import runner
from snapeval.run.plan import PlannedPoint
from snapeval.run.points import SampleCall
from snapeval.run.signals import Terminated
from snapeval.run.workers import SETTINGS_PER_PREFILL, ClaimingFeed, shard

#: A small point of the embedded model: 128-token passkey prompts, one row at a time so that samples
#: are claimed one by one.
SMALL = ("task=ruler_passkey", "task.context_length=128", "run.batch_size=1", "run.progress=false")


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory) -> str:
    """A PostgreSQL server of its own, listening only on a Unix socket in a temporary folder."""
    pgserver = pytest.importorskip("pgserver", reason="pip install -e '.[test]' ships pgserver")
    pytest.importorskip("psycopg", reason="pip install 'snapeval[cluster]' ships psycopg")
    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    return server.get_uri()


def config(name: str = "t") -> dict:
    return {"model": {"name": "m"}, "task": {"name": name}, "cache": {"method": "full"}}


def row(sample_id: str) -> dict:
    return {"sample_id": sample_id, "output": "o", "score": 1.0, "prefill_s": 0.1, "decode_s": 0.1}


def dead_pid() -> int:
    """The pid of a process of this host that has ended."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def set_run(db: ResultsDB, run_id: int, **values) -> None:
    with db.engine.begin() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(**values))


class StoppedClock:
    """A :data:`~snapeval.results.leases.Clock` that moves only when told to (:meth:`advance`)."""

    def __init__(self) -> None:
        self.now = datetime.now(timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> StoppedClock:
    return StoppedClock()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path, clock) -> ResultsDB:
    url = tmp_path / "db.sqlite" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    with ResultsDB(url, clock=clock) as opened:
        yield opened


def test_claims_split_samples_and_return_when_their_worker_dies(db, clock):
    digest = f"h{time.monotonic_ns()}"  # the PostgreSQL server is shared by the module's tests
    first, second = db.start_run(config(), digest), db.start_run(config(), digest)
    assert db.claim(digest, ["a", "b"], first, lease_s=60) == {"a", "b"}
    assert db.claim(digest, ["a", "b", "c"], second, lease_s=60) == {"c"}  # a live worker's claims hold
    assert db.claim(digest, ["a", "b"], first, lease_s=60) == {"a", "b"}  # a worker keeps its own
    assert db.add_sample(first, digest, row("a")) and not db.add_sample(second, digest, row("a"))
    assert db.claim(digest, ["a"], second, lease_s=60) == set()  # stored: nobody's to claim
    set_run(db, first, pid=dead_pid())  # the first worker's process ends on this host
    assert db.claim(digest, ["b"], second, lease_s=60) == {"b"}  # its claim returns at once
    third = db.start_run(config(), digest)
    set_run(db, third, hostname="elsewhere")  # a worker on another node: only its lease expires it
    assert db.claim(digest, ["d"], third, lease_s=1) == {"d"}
    assert db.claim(digest, ["d"], second, lease_s=60) == set()
    clock.advance(0.9)
    assert db.claim(digest, ["d"], second, lease_s=60) == set()  # within its lease
    clock.advance(0.2)
    assert db.claim(digest, ["d"], second, lease_s=60) == {"d"}  # its lease ran out
    db.finish_run(second)  # a finished run drops its claims
    assert db.claim(digest, ["b", "c", "d"], third, lease_s=60) == {"b", "c", "d"}


def test_runs_whose_worker_is_gone_are_stale_and_summary_says_so(tmp_path):
    path = tmp_path / "db.sqlite"
    with ResultsDB(path) as db:
        alive, killed, lost, superseded = (db.start_run(config(name), name) for name in "abcd")
        set_run(db, killed, pid=dead_pid())
        set_run(db, lost, hostname="elsewhere")
        db.renew([lost], lease_s=-1)  # its heartbeat stopped: the lease ran out
        set_run(db, superseded, pid=dead_pid())
        db.finish_run(db.start_run(config("d"), "d"))  # a later run of the same config finished it
        states = {run["id"]: run["status"] for run in db.run_states()}
        attention = [run["id"] for run in needing_attention(db.run_states())]
    assert [states[run] for run in (alive, killed, lost, superseded)] == [
        "running",
        "stale",
        "stale",
        "stale",
    ]
    assert attention == [alive, killed, lost]
    summary = subprocess.run(
        [sys.executable, "-m", "snapeval.results", "summary", "--db", str(path)],
        capture_output=True,
        text=True,
    )
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert "3 run(s) not finished" in summary.stdout
    assert sum(" stale " in line for line in lines) == 2 and sum(" running " in line for line in lines) == 1


def test_shards_hold_every_sample_once_in_order():
    items = list(range(10))
    for count in (1, 3, 4, 10, 12):
        pieces = [shard(items, f"{index}/{count}") for index in range(count)]
        assert [item for piece in pieces for item in piece] == items
        assert max(map(len, pieces)) - min(map(len, pieces)) <= 1
    assert shard(items, None) == items


BAD_DATABASES = {
    "directory": ("{tmp}", "is a directory, not a database file"),
    "corrupt": ("{tmp}/corrupt.sqlite", "file is not a database"),
    "read-only": (
        '"sqlite:///file:{tmp}/ro.sqlite?mode=ro&uri=true"',
        "attempt to write a readonly database",
    ),
    "unsupported": ("mysql://host/db", "unsupported database 'mysql'; use a SQLite path or postgresql://"),
    "unreachable": (
        "postgresql://127.0.0.1:1/snapeval",
        "cannot use postgresql+psycopg://127.0.0.1:1/snapeval",
    ),
}


def bad_databases(tmp_path: Path) -> None:
    (tmp_path / "corrupt.sqlite").write_text("not a database\n" * 100)
    ResultsDB(tmp_path / "ro.sqlite").close()  # a real database, opened read-only by its URL


@pytest.mark.parametrize("case", BAD_DATABASES)
def test_a_database_that_cannot_be_used_is_one_line_naming_run_db(case, tmp_path, capsys):
    """What ``python -m snapeval run.db=<url>`` prints and returns, from its checks before Hydra starts
    (CONNECT_TIMEOUT_S bounds a silent server)."""
    bad_databases(tmp_path)
    url, message = BAD_DATABASES[case]
    with pytest.raises(SnapevalError) as error:
        check_before_hydra(["run.db=" + url.format(tmp=tmp_path), "run.limit=1"])
    assert report(error.value) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run.db: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_database_that_cannot_be_used_ends_the_command_before_torch_loads(tmp_path, torch_refused):
    bad_databases(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "snapeval", f"run.db={tmp_path}/corrupt.sqlite", "run.limit=1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=torch_refused,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: run.db: ") and result.stderr.count("\n") == 1
    assert "file is not a database" in result.stderr


def start_worker(path: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "snapeval", f"run.db={path}", *SMALL, *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stored(path: Path) -> list[dict]:
    with ResultsDB(path) as db, db.engine.connect() as conn:
        return [dict(row) for row in conn.execute(select(samples)).mappings()]


def wait_for(path: Path, count: int, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(stored(path)) < count and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_ends_the_run_as_interrupted_and_keeps_its_samples(tmp_path):
    path = tmp_path / "db.sqlite"
    worker = start_worker(path, "run.limit=20")
    wait_for(path, 1, worker)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 143 and "Traceback" not in err
    assert "interrupted: every sample stored so far is kept" in err
    with ResultsDB(path) as db:
        assert [run["status"] for run in db.run_states()] == ["interrupted"]
    assert 1 <= len(stored(path)) < 20


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_stores_each_sample_once(tmp_path):
    path, limit, chance = tmp_path / "db.sqlite", 12, random.Random(int(os.environ.get("SNAPEVAL_SEED", 0)))
    for _ in range(3):
        worker = start_worker(path, f"run.limit={limit}")
        wait_for(path, len(stored(path)) + chance.randint(1, 2), worker)  # its run has started
        time.sleep(chance.uniform(0, 1))  # then anywhere: prefilling, decoding, scoring, committing
        worker.kill()
        worker.wait()
    resumed = start_worker(path, f"run.limit={limit}")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    rows = stored(path)
    assert sorted(row["sample_id"] for row in rows) == sorted({row["sample_id"] for row in rows})
    assert len(rows) == limit and all(row["output"] is not None and row["score"] is not None for row in rows)
    with ResultsDB(path) as db:
        states = [run["status"] for run in db.run_states()]
    assert states == ["stale"] * 3 + ["finished"]


@pytest.mark.slow
def test_four_workers_on_one_sqlite_point_split_it_without_locks_or_duplicates(tmp_path):
    path, limit = tmp_path / "db.sqlite", 8
    workers = [start_worker(path, f"run.limit={limit}") for _ in range(4)]
    errors = [worker.communicate(timeout=600)[1] for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * 4, errors
    assert not any("locked" in err for err in errors)
    rows = stored(path)
    assert len(rows) == len({row["sample_id"] for row in rows}) == limit
    assert len({row["run_id"] for row in rows}) >= 2  # the point was split, not computed twice


@pytest.mark.slow
def test_sharded_sweep_with_the_joblib_launcher_on_postgresql_then_resume(postgres_url, tmp_path):
    sweep = [
        sys.executable, "-m", "snapeval", "-m", *SMALL, "run.limit=4", "run.shard=0/2,1/2",
        "cache=full,snapstream", "cache.budget=112", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
        f'run.db="{postgres_url}"',
    ]  # fmt: skip
    first = subprocess.run(sweep, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert (
        first.returncode == 0 and "[sweep] 2 points, 0 failed" in first.stdout
    )  # 4 jobs (2 points x 2 shards) on 2 processes, first.stderr[-2000:]
    summary = subprocess.run(
        [sys.executable, "-m", "snapeval.results", "summary", "--db", postgres_url],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    lines = [line for line in summary.stdout.splitlines() if "ruler_passkey" in line]
    header = [cell.strip() for cell in summary.stdout.splitlines()[0].split("|")]
    counts = [[cell.strip() for cell in line.split("|")][header.index("n")] for line in lines]
    assert counts == ["4", "4"], summary.stdout  # two points, n=4 each
    with ResultsDB(postgres_url) as db:
        first_runs = {run["id"] for run in db.run_states() if run["task"] == "ruler_passkey"}
    again = subprocess.run(sweep, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    with ResultsDB(postgres_url) as db:
        passkey = [run for run in db.run_states() if run["task"] == "ruler_passkey"]
        rows = [row for digest in {run["config_hash"] for run in passkey} for row in db.samples_for(digest)]
    assert len(passkey) == 8 and all(run["status"] == "finished" for run in passkey)
    assert len(rows) == 8 and {row["run_id"] for row in rows} <= first_runs  # resumed: nothing computed again


def budget_grid(points: int, *methods: str) -> str:
    budgets = ", ".join(str(112 + 16 * i) for i in range(points))
    return f"grid={{cache: [{', '.join(methods or ['snapstream'])}], params: {{budget: [{budgets}]}}}}"


def test_sigterm_closes_every_run_of_a_grid_at_once(tiny_llama_overrides, tmp_path, one_torch_thread):
    """SIGTERM (twice) while a grid evaluates: the run stops within seconds, each setting's run is closed
    as interrupted and no claim is left."""
    path = tmp_path / "db.sqlite"
    cfg = compose_config(
        f"run.db={path}", "run.progress=false", *tiny_llama_overrides, budget_grid(8, "full", "snapstream"),
        "run.limit=4", "task.context_length=256", "task.max_new_tokens=200", "run.batch_size=2",
    )  # fmt: skip
    sent: list[float] = []

    def terminate_once_claimed() -> None:
        deadline = time.monotonic() + 120
        while not claims_taken(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        sent.append(time.monotonic())
        for _ in range(2):  # a second one, as from an impatient scheduler, must not cut the closing short
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)

    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a late signal must not end pytest
    try:
        watcher = threading.Thread(target=terminate_once_claimed)
        watcher.start()
        with pytest.raises(Terminated):
            runner.run(cfg)
        stopped = time.monotonic()
        watcher.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped - sent[0] < 10
    with ResultsDB(path) as db, db.engine.connect() as conn:
        states = [run["status"] for run in db.run_states()]
        assert conn.execute(select(func.count()).select_from(claims)).scalar() == 0
    assert states == ["interrupted"] * 9  # the full cache and 8 budgets


def claims_taken(path: Path) -> bool:
    """Whether a worker holds a claim in the database at ``path`` (read-only; none before it exists)."""
    if not path.exists():
        return False
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("SELECT count(*) FROM claims").fetchone()[0] > 0
    except sqlite3.OperationalError:  # its tables are not made yet
        return False
    finally:
        conn.close()


class CountedRequest:
    """A request of the batcher as the claiming feed reads it: its tag, each read counted."""

    reads = 0

    def __init__(self, point: object, prompt: object) -> None:
        self._tag = SampleCall(point, prompt)

    @property
    def tag(self) -> SampleCall:
        CountedRequest.reads += 1
        return self._tag


def planning_work(tmp_path: Path, points: int, prompts: int, monkeypatch) -> dict[str, int]:
    """Transactions, config hashes and request reads that starting a grid of ``points`` settings and
    claiming all of its ``prompts`` samples take, without a model."""
    configs = grid_points(compose_config(budget_grid(points)))
    assert len(configs) == points
    problems = [types.SimpleNamespace(id=f"s{i}", metadata={}) for i in range(prompts)]
    hashes = []
    monkeypatch.setattr(runner, "config_hash", lambda config: hashes.append(1) or config_hash(config))
    CountedRequest.reads = 0
    with ResultsDB(tmp_path / f"{points}.sqlite") as db:
        commits = []
        event.listen(db.engine, "commit", lambda conn: commits.append(1))
        planned = [PlannedPoint(config, CacheSetting.of(config["cache"])) for config in configs]
        started = runner._start_points(db, planned, problems, lease_s=60)
        start_commits = len(commits)
        queued = [CountedRequest(point, problem) for problem in problems for point in started]
        feed = ClaimingFeed(db, queued, batch_size=8, lease_s=60)
        while feed.next():
            pass
    assert all(len(point.claimed) == prompts for point in started)
    return {
        "start": start_commits,
        "claims": len(commits) - start_commits,
        "hashes": len(hashes),
        "reads": CountedRequest.reads,
    }


def test_planning_a_grid_is_linear_in_its_settings(tmp_path, monkeypatch):
    """Starting a grid's runs takes one transaction whatever its size; claiming its samples one per
    problem and :data:`SETTINGS_PER_PREFILL` settings (and the first group, only the rows' worth); each
    setting is hashed once and each request read a fixed number of times: ten times the settings, ten
    times the work, not a hundred."""
    small, large = (planning_work(tmp_path, points, 3, monkeypatch) for points in (100, 1000))
    assert small["start"] == large["start"] == 1
    assert large["claims"] == 3 * math.ceil(1000 / SETTINGS_PER_PREFILL) + 1  # the first group: 8 rows
    assert (small["hashes"], large["hashes"]) == (100, 1000)
    assert large["reads"] <= 10 * small["reads"]
