"""Launching tensor-parallel ranks as one command (``snapeval run --nproc N``), the launcher's world read
from the environment, the ranks' rendezvous, and signals that stop every rank together.

* ``--nproc`` is checked in one line; the launcher gives each rank torchrun's environment, passes rank 0's
  output on and keeps the others', names a rank that failed where rank 0 did not say it, ends the rest,
  and exits with rank 0's code (the failed rank's where rank 0 was stopped).
* A malformed launcher environment is refused in one line by every command (``RANK=1 snapeval report``).
* A rank whose peers never come says whom it waits for, then gives up after ``run.rendezvous_s``.
* Under tensor parallel a signal is noted and every rank stops at the same point (one all-reduce).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from snapeval.cli import launch as launcher
from snapeval.cli.launch import split_nproc
from snapeval.errors import SnapevalError
from snapeval.run.signals import Terminated, stop_on_signals

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240
RUN = ("run.limit=2", "task.context_length=512", "cache=snapstream", "cache.budget=128", "run.progress=false")


def test_nproc_is_taken_out_of_the_overrides_and_checked():
    assert split_nproc(["--nproc", "3", "cache=full"]) == (3, ["cache=full"])
    assert split_nproc(["cache=full", "--nproc=2", "-m"]) == (2, ["cache=full", "-m"])
    assert split_nproc(["cache=full"]) == (None, ["cache=full"])
    for bad in (["--nproc", "0"], ["--nproc=abc"], ["--nproc"], ["--nproc=-1"]):
        with pytest.raises(SnapevalError, match="--nproc"):
            split_nproc(bad)


def test_a_bad_nproc_or_a_rank_that_launches_is_refused_in_one_line_before_torch(torch_refused, tmp_path):
    bad = subprocess.run(
        [sys.executable, "-m", "snapeval", "--nproc", "zero"],
        capture_output=True,
        text=True,
        env=torch_refused,
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --nproc: 'zero' is not a number of processes (1 or more)"
    ]
    nested = subprocess.run(
        [sys.executable, "-m", "snapeval", "--nproc", "2"],
        capture_output=True,
        text=True,
        env={**torch_refused, "WORLD_SIZE": "2"},
    )
    assert nested.returncode == 2 and len(nested.stderr.strip().splitlines()) == 1
    assert "a rank already" in nested.stderr


def launched(monkeypatch, capfd, count: int, **actions: str) -> tuple[int, str, str]:
    """:func:`launcher.launch` of ``count`` stand-in ranks (tests/launched_rank.py) doing ``actions``."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(launcher, "GRACE_S", 0.5)
    monkeypatch.setattr(launcher, "KILL_AFTER_S", 2.0)
    for rank, action in actions.items():
        monkeypatch.setenv(f"LAUNCHED_{rank.removeprefix('rank')}", action)
    code = launcher.launch(count, [], module="tests.launched_rank")
    out, err = capfd.readouterr()
    return code, out, err


def test_the_ranks_get_torchruns_environment_and_rank_0_alone_speaks(monkeypatch, capfd):
    code, out, err = launched(monkeypatch, capfd, 3, rank1="exit:0:error: not shown")
    assert code == 0 and err == ""
    (line,) = out.splitlines()
    assert line.startswith("rank 0 of 3 at 127.0.0.1:") and int(line.rsplit(":", 1)[1]) > 0


def test_a_refusal_every_rank_says_is_said_once_with_its_code(monkeypatch, capfd):
    refusal = "error: model.tp: llama has 4 query and 2 KV heads"
    code, _, err = launched(monkeypatch, capfd, 3, rank0=f"exit:2:{refusal}", rank1=f"exit:2:{refusal}")
    assert code == 2 and err.splitlines() == [refusal]


def test_a_rank_that_fails_alone_is_named_and_the_others_are_ended(monkeypatch, capfd):
    code, _, err = launched(
        monkeypatch,
        capfd,
        3,
        rank0="sleep-then-interrupted",
        rank1="sleep",
        rank2="exit:3:error: out of memory",
    )
    assert code == 3
    assert err.splitlines() == [
        "interrupted: stored samples kept",
        "error: --nproc: rank 2 exited with code 3: error: out of memory",
    ]


def test_a_malformed_launcher_environment_is_refused_by_the_reading_commands(tmp_path):
    """``RANK=1 snapeval report`` is no rank of a launch: one line, exit 2, never a silent exit 0."""
    environment = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    for module, rank in (("snapeval.report", "1"), ("snapeval.figures", "abc")):
        done = subprocess.run(
            [sys.executable, "-m", module, "--db", str(tmp_path / "none.db")],
            capture_output=True,
            text=True,
            env={**environment, "RANK": rank},
        )
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1 and "RANK" in done.stderr, done.stderr


def test_a_signal_under_tensor_parallel_stops_every_rank_at_the_same_check():
    """A SIGTERM (or Ctrl-C) is noted, not raised where it lands; :meth:`Stops.check` raises it, and
    the noted signal travels through an all-reduce (here a world of one on gloo)."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    try:
        with stop_on_signals(tensor_parallel=True) as stops:
            stops.check()  # nothing received: goes on
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler has run: noted, not raised
            assert stops.received == signal.SIGTERM
            with pytest.raises(Terminated):
                stops.check()
        with stop_on_signals(tensor_parallel=False), pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # .ci/run runs it
def test_a_rank_whose_peers_never_come_says_so_and_gives_up(tiny_llama_overrides, tmp_path):
    """``WORLD_SIZE=2 RANK=1`` by hand: without MASTER_ADDR one line naming it; with it and no peers, a
    note saying whom it waits for and where, then one line after ``run.rendezvous_s``."""
    base = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    base.update(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "snapeval", *tiny_llama_overrides, *RUN, f"run.db={tmp_path / 'r.db'}"]
    bare = subprocess.run(command, capture_output=True, text=True, env=base, timeout=TIMEOUT_S)
    assert bare.returncode == 2 and bare.stderr.strip().splitlines()[-1].startswith("error: model.tp:")
    assert "MASTER_ADDR and MASTER_PORT" in bare.stderr and "Traceback" not in bare.stderr
    alone = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}  # nothing listens there
    waited = subprocess.run(
        [*command, "run.rendezvous_s=5"], capture_output=True, text=True, env=alone, timeout=TIMEOUT_S
    )
    lines = waited.stderr.strip().splitlines()
    assert waited.returncode == 2 and "Traceback" not in waited.stderr, waited.stderr
    assert "rank 1 of 2: waiting for the 2 ranks to meet at 127.0.0.1:9 (at most 5 s" in lines[-2]
    assert lines[-1].startswith("error: run.rendezvous_s: rank 1 of 2: the ranks did not meet")
    assert not (tmp_path / "r.db").exists()


def test_a_refused_launch_says_one_line_exits_2_and_leaves_no_file(tiny_llama_overrides, tmp_path):
    """``snapeval run --nproc 2`` refused on every rank (graphs need a GPU): one line, exit 2, no database."""
    db = tmp_path / "refused.db"
    command = [sys.executable, "-m", "snapeval", "--nproc", "2", *tiny_llama_overrides, *RUN]
    done = subprocess.run(
        [*command, "run.compile=graphs", f"run.db={db}"], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert done.returncode == 2 and len(errors) == 1 and "run.compile" in errors[0], done.stderr
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("refused.db*"))


def launched_by(how: str, ranks: int) -> list[str]:
    """``python -m snapeval`` on ``ranks`` ranks, started by ``--nproc`` or by torchrun."""
    if how == "nproc":
        return [sys.executable, "-m", "snapeval", "--nproc", str(ranks)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    return [*torchrun, "-m", "snapeval"]


@pytest.mark.slow  # .ci/run runs it
@pytest.mark.parametrize("how", ["nproc", "torchrun"])
def test_a_tp_refusal_after_the_database_opened_leaves_no_file(how, tiny_llama_overrides, tmp_path):
    """3 ranks cannot split 4 query heads: refused on every rank after rank 0 opened its database,
    which is removed; ``--nproc`` says it once with exit 2."""
    db = tmp_path / "tp3.db"
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = launched_by(how, 3)
    command = [*start, *tiny_llama_overrides, *RUN, f"run.db={db}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=environment)
    assert "cannot split" in done.stderr and not list(tmp_path.glob("tp3.db*")), done.stderr[-2000:]
    if how == "nproc":
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [
            "error: model.tp: llama has 4 query and 2 KV heads: 3 ranks cannot split its 4 query heads "
            "(ranks that can: 2)"
        ]


def samples_in(db: Path) -> int:
    try:
        with sqlite3.connect(db) as connection:
            return connection.execute("SELECT count(*) FROM samples").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.slow  # .ci/run runs it
@pytest.mark.parametrize("how", ["nproc", "torchrun"])
def test_sigterm_stops_every_rank_together_as_interrupted(how, tiny_llama_overrides, tmp_path):
    """SIGTERM to the launcher once a sample is stored: every rank stops at the same step, says it was
    interrupted, and the run is closed so (a rank left for torchrun's SIGKILL would leave it running)."""
    db = tmp_path / "tp2.db"
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = launched_by(how, 2)
    command = [*start, *tiny_llama_overrides, *RUN[1:], "run.limit=12", "task.max_new_tokens=48"]
    command += ["run.batch_size=1", f"run.db={db}"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None and not samples_in(db):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=TIMEOUT_S)
    assert "interrupted:" in err, err[-3000:]
    if how == "nproc":  # torchrun adds its own traceback of the signal it got
        assert process.returncode == 143 and "Traceback" not in err, err[-3000:]
        assert [line for line in err.splitlines() if line.startswith(("error", "interrupted"))] == [
            "interrupted: every sample stored so far is kept; the same command resumes the run"
        ]
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
        rows = connection.execute("SELECT output, score FROM samples").fetchall()
    assert 1 <= len(rows) < 12 and all(None not in row for row in rows)


@pytest.mark.slow  # .ci/run runs it
def test_a_sweep_on_ranks_prints_and_records_once(tiny_llama_overrides, tmp_path):
    """``snapeval run --nproc 2 -m ...``: rank 0 alone prints Hydra's lines, the points and the sweep
    table, and one multirun folder is made."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    sweep = tmp_path / "multirun"
    command = [sys.executable, "-m", "snapeval", "--nproc", "2", "-m", *tiny_llama_overrides, *RUN[1:]]
    command += ["run.limit=1", "task.max_new_tokens=4", "cache.budget=128,256", f"run.db={tmp_path / 's.db'}"]
    command.append(f"hydra.sweep.dir={sweep}")
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=TIMEOUT_S, env=environment, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("Launching 2 jobs locally") == 1 and done.stdout.count("[sweep] point 1/2") == 1
    assert done.stdout.count("[sweep] 2 points, 0 failed") == 1
    assert sorted(path.name for path in sweep.iterdir()) == ["0", "1", "multirun.yaml"]
    assert not (tmp_path / "results").exists()  # no other rank's folder beside it
