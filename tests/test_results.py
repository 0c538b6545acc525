import math
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import select

from snapeval.results import DB_ENV_VAR, DEFAULT_DB, ResultsDB, config_hash, database_url, load, summarize
from snapeval.results.__main__ import main as results_main
from snapeval.results.schema import runs

# Writes samples first..first+count-1 of a config, says so, then finishes its run or hangs.
WRITER = """
import sys, time
from snapeval.results import ResultsDB
url, config_hash, first, count, then = sys.argv[1:]
db = ResultsDB(url)
run_id = db.start_run({"writer": first}, config_hash)
for i in range(int(first), int(first) + int(count)):
    db.add_sample(run_id, config_hash, {"sample_id": i, "score": 1.0})
print("stored", flush=True)
if then == "hang":
    time.sleep(60)
db.finish_run(run_id)
"""


def writer(db: Path, config_hash: str, first: int, count: int, then: str = "finish") -> subprocess.Popen:
    args = [sys.executable, "-c", WRITER, str(db), config_hash, str(first), str(count), then]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys) -> Callable[..., tuple[int, str, str]]:
    """``python -m snapeval.results <args>`` run in ``tmp_path``, in process: exit code, stdout, stderr."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DB_ENV_VAR, raising=False)

    def run(*args: str) -> tuple[int, str, str]:
        code = results_main(list(args))
        return code, *capsys.readouterr()

    return run


@pytest.fixture
def config() -> dict:
    return {
        "model": {"name": "smollm2-135m", "dtype": "float32"},
        "task": {"name": "niah"},
        "cache": {"method": "snapkv", "budget": 256, "window": 32, "kernel": 7, "pooling": "max"},
        "seed": 0,
        "run": {"limit": 3, "db": "results/snapeval.sqlite"},
    }


def sample(sample_id: int, score: float = 1.0, **fields) -> dict:
    return {"sample_id": sample_id, "score": score, **fields}


def test_round_trip_flattens_the_config_and_expands_metrics(tmp_path, config):
    path = tmp_path / "nested" / "results.sqlite"
    digest = config_hash(config)
    with ResultsDB(path) as db:
        run_id = db.start_run(config, digest)
        db.add_sample(
            run_id,
            digest,
            sample(
                0,
                1.0,
                prompt_tokens=4096,
                output="The needle is 42.",
                target=["42"],
                metrics={"exact_match": 1.0, "f1": 0.5},
                prefill_s=0.25,
                decode_s=0.5,
                generated_tokens=8,
                peak_memory_bytes=2**30,
                kv_bytes=3 * 2**20,
                extra={"kept": [0, 1, 2]},
            ),
        )
        db.add_sample(run_id, digest, sample(1, 0.0))
        db.finish_run(run_id)
        with db.engine.connect() as conn:
            run = conn.execute(select(runs)).mappings().one()

    assert (run["status"], run["config"], run["config_hash"]) == ("finished", config, digest)
    assert (run["model"], run["task"], run["method"]) == ("smollm2-135m", "niah", "snapkv")
    assert run["finished_at"] is not None and run["hostname"]
    assert run["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert run["versions"]["snapeval"] == "0.1.0"

    df = load(path)
    assert list(df["sample_id"]) == ["0", "1"]
    first = df.iloc[0]
    assert first[["model.name", "cache.budget", "cache.pooling", "seed"]].tolist() == [
        "smollm2-135m",
        256,
        "max",
        0,
    ]
    aliases = ["model", "task", "method", "budget", "window", "kernel", "pooling"]
    assert first[aliases].tolist() == ["smollm2-135m", "niah", "snapkv", 256, 32, 7, "max"]
    assert first[["run_id", "status", "config_hash"]].tolist() == [run_id, "finished", digest]
    assert {"git_sha", "created_at"} <= set(df.columns)
    assert first[["output", "target", "score", "kv_bytes", "extra"]].tolist() == [
        "The needle is 42.",
        ["42"],
        1.0,
        3 * 2**20,
        {"kept": [0, 1, 2]},
    ]
    assert first[["metric.exact_match", "metric.f1"]].tolist() == [1.0, 0.5]
    assert math.isnan(df.iloc[1]["metric.f1"])


def test_every_frame_says_how_each_setting_was_deployed(tmp_path, config):
    """``cache.prefill_chunk`` and ``cache.kv_dtype`` are columns of every loaded frame: null for a setting
    that left them unset (whole prefill, the model's dtype), the value for one that set them."""
    deployed = {**config, "cache": {**config["cache"], "prefill_chunk": 256, "kv_dtype": "fp8_e4m3"}}
    path = tmp_path / "results.sqlite"
    with ResultsDB(path) as db:
        for index, setting in enumerate((config, deployed)):
            digest = config_hash(setting)
            db.add_sample(db.start_run(setting, digest), digest, sample(index))
    df = load(path).set_index("sample_id")
    assert df.loc["0", ["cache.prefill_chunk", "cache.kv_dtype"]].isna().all()
    assert df.loc["1", ["cache.prefill_chunk", "cache.kv_dtype"]].tolist() == [256, "fp8_e4m3"]
    only_default = tmp_path / "default.sqlite"
    with ResultsDB(only_default) as db:
        digest = config_hash(config)
        db.add_sample(db.start_run(config, digest), digest, sample(0))
    assert {"cache.prefill_chunk", "cache.kv_dtype"} <= set(load(only_default).columns)


def test_adding_a_stored_sample_again_keeps_the_first(tmp_path, config):
    db = ResultsDB(tmp_path / "results.sqlite")
    digest = config_hash(config)
    run_id = db.start_run(config, digest)
    assert db.add_sample(run_id, digest, sample(7, 1.0))
    assert not db.add_sample(run_id, digest, sample("7", 0.0))
    assert [(row["sample_id"], row["score"]) for row in db.samples_for(digest)] == [("7", 1.0)]


def test_config_hash_ignores_where_and_how_many_but_not_what(config):
    digest = config_hash(config)
    assert len(digest) == 64
    more = {**config, "run": {"limit": 10, "db": "elsewhere"}, "hydra": {"job": 1}}
    assert config_hash(more) == digest
    assert config_hash(dict(reversed(config.items()))) == digest
    assert config_hash({**config, "cache": {**config["cache"], "budget": 512}}) != digest
    assert config_hash(more, ignore=()) != config_hash(config, ignore=())


def test_a_killed_run_keeps_its_samples_and_resumes(tmp_path, config):
    path = tmp_path / "results.sqlite"
    digest = config_hash(config)
    killed = writer(path, digest, first=0, count=3, then="hang")
    assert killed.stdout.readline() == "stored\n"
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=10)

    db = ResultsDB(path)
    done = db.done_sample_ids(digest)
    assert done == {"0", "1", "2"}
    run_id = db.start_run(config, digest)
    for sample_id in range(5):
        if str(sample_id) not in done:
            db.add_sample(run_id, digest, sample(sample_id))
    db.finish_run(run_id)

    df = load(path)
    assert sorted(df["sample_id"]) == ["0", "1", "2", "3", "4"]
    assert df.groupby("status")["sample_id"].count().to_dict() == {"failed": 3, "finished": 2}
    assert [run["status"] for run in ResultsDB(path).run_states()] == ["stale", "finished"]  # closed as such


def test_concurrent_writers_all_land(tmp_path):
    path = tmp_path / "results.sqlite"
    writers = [writer(path, "shared", first=100 * i, count=20) for i in range(3)]
    assert [w.wait(timeout=30) for w in writers] == [0] * 3
    df = load(path)
    assert len(df) == df["sample_id"].nunique() == 60
    assert set(df["status"]) == {"finished"}


def test_sqlalchemy_url_and_default_location(tmp_path, config, monkeypatch):
    path = tmp_path / "by-url" / "results.sqlite"
    url = f"sqlite:///{path}"
    digest = config_hash(config)
    with ResultsDB(url) as db:
        db.add_sample(db.start_run(config, digest), digest, sample(0))
    assert path.is_file()
    assert load(url)["sample_id"].tolist() == ["0"]

    monkeypatch.delenv("SNAPEVAL_DB", raising=False)
    assert database_url() == f"sqlite:///{DEFAULT_DB}"
    monkeypatch.setenv("SNAPEVAL_DB", url)
    assert database_url() == url


def test_summarize_per_experiment():
    df = pd.DataFrame(
        {
            "model": "m",
            "task": "t",
            "method": ["full"] * 4 + ["snapkv"] * 2,
            "budget": [None] * 4 + [64, 64],
            "score": [1.0, 1.0, 1.0, 0.0, 1.0, 0.5],
            "kv_bytes": [2**20] * 4 + [2**19] * 2,
            "prefill_s": [0.1, 0.2, 0.3, 0.4, 1.0, 1.0],
            "decode_s": [1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
            "generated_tokens": [10, 20, 30, 40, 0, 0],
        }
    )
    full, snapkv = summarize(df).to_dict("records")
    assert full["method"] == "full" and math.isnan(full["budget"])
    assert full["accuracy"] == 0.75 and full["n"] == 4
    assert (full["ci_low"], full["ci_high"]) == pytest.approx((0.30064, 0.95441), abs=1e-5)
    assert (full["kv_mib"], full["prefill_s"], full["decode_tok_s"]) == pytest.approx((1.0, 0.25, 25.0))
    assert (snapkv["budget"], snapkv["accuracy"], snapkv["kv_mib"]) == (64, 0.75, 0.5)
    assert (snapkv["ci_low"], snapkv["ci_high"]) == (0.0, 1.0)
    assert math.isnan(snapkv["decode_tok_s"])


def test_cli_summary_and_export(tmp_path, config, cli):
    digest = config_hash(config)
    with ResultsDB(tmp_path / DEFAULT_DB) as db:
        run_id = db.start_run(config, digest)
        for sample_id, score in enumerate([1.0, 1.0, 1.0, 0.0]):
            db.add_sample(run_id, digest, sample(sample_id, score, target=["x"], decode_s=1.0))
        db.finish_run(run_id)

    code, out, err = cli("summary")
    assert code == 0, err
    header, _, row = out.splitlines()
    cells = dict(zip(header.split("|"), row.split("|"), strict=True))
    assert {name.strip(): value.strip() for name, value in cells.items() if name} == {
        "model": "smollm2-135m",
        "task": "niah",
        "method": "snapkv",
        "budget": "256",
        "window": "32",
        "kernel": "7",
        "pooling": "max",
        "accuracy": "0.750",
        "95% CI": "[0.301, 0.954]",  # the run table's names and formats
        "n": "4",
        "KV MiB": "-",  # not recorded
        "prefill s": "-",
        "decode tok/s": "0.0",
    }

    code, out, err = cli("export", "--csv", "out/samples.csv", "--db", str(tmp_path / DEFAULT_DB))
    assert (code, out) == (0, "wrote 4 samples to out/samples.csv\n"), err
    exported = pd.read_csv(tmp_path / "out" / "samples.csv")
    assert exported["score"].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert exported["target"].tolist() == ['["x"]'] * 4
    assert exported["cache.budget"].tolist() == [256] * 4


def test_cli_without_a_database_says_so_in_one_line(tmp_path, cli):
    code, out, err = cli("summary")
    assert (code, out) == (2, "")
    assert err == f"error: --db: no results database at {DEFAULT_DB}; run python -m snapeval first\n"
    assert not (tmp_path / DEFAULT_DB).exists()


def test_summary_never_pools_experiments_that_differ_outside_the_aliases(tmp_path, config, cli):
    """Three runs differing only in sampling: three rows of n=2, the differing column shown; a fourth
    run with the same config as the first (another limit) joins its row."""
    with ResultsDB(tmp_path / DEFAULT_DB) as db:
        for temperature, scores in ((0.2, [1.0, 1.0]), (0.6, [1.0, 0.0]), (1.0, [0.0, 0.0])):
            sampled = {**config, "generation": {"do_sample": True, "temperature": temperature}}
            digest = config_hash(sampled)
            run_id = db.start_run(sampled, digest)
            for index, score in enumerate(scores):
                db.add_sample(run_id, digest, sample(index, score))
            db.finish_run(run_id)
        again = {
            **config,
            "run": {**config["run"], "limit": 9},
            "generation": {"do_sample": True, "temperature": 0.2},
        }
        digest = config_hash(again)
        run_id = db.start_run(again, digest)
        db.add_sample(run_id, digest, sample(5, 0.0))
        db.finish_run(run_id)
    table = summarize(load(tmp_path / DEFAULT_DB))
    assert list(table["generation.temperature"]) == [0.2, 0.6, 1.0]
    assert list(table["n"]) == [3, 2, 2] and list(table["accuracy"]) == pytest.approx([2 / 3, 0.5, 0.0])
    assert "run.limit" not in table and "generation.do_sample" not in table  # same hash / same value
    printed = cli("summary")[1]
    assert "generation.temperature" in printed and len(printed.strip().splitlines()) == 2 + 3
