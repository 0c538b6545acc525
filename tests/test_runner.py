"""The runner end to end: answers on the embedded model; storage, resume, interruption, draws and rows
on a tiny random-weight Llama with SmolLM2's tokenizer (prompts as on the embedded model, answers random)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError

from snapeval.cli import report
from snapeval.decode.generation import generate
from snapeval.errors import SnapevalError
from snapeval.models import encode_chat
from snapeval.results import ResultsDB, load
from snapeval.results.schema import claims, runs
from snapeval.results.tables import run_table
from snapeval.run import runner
from snapeval.run.evaluation import Evaluation

from .conftest import compose_config

TINY_KV_BYTES = 128 * 2 * 2 * 16 * 2 * 4  # slots x layers x KV heads x head dim x (K, V) x fp32


def test_chat_prompt_without_extra_special_tokens_answers_paris(smollm):
    ids = encode_chat(smollm.tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    assert ids.count(smollm.tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # system, user, assistant
    from snapeval.cache import FullCache

    result = generate(smollm.model, ids, FullCache(), 16, {smollm.tokenizer.eos_token_id})
    assert "Paris" in smollm.tokenizer.decode(result.tokens)


def config(tmp_path, *overrides):
    return compose_config(f"run.db={tmp_path / 'db.sqlite'}", "run.progress=false", *overrides)


@pytest.fixture(scope="module")
def tiny(tiny_llama_overrides) -> tuple[str, str]:
    """Overrides that run the session's 2-layer random Llama saved with SmolLM2's tokenizer."""
    return tiny_llama_overrides


@pytest.mark.slow  # the embedded model end to end (.ci/run runs it, and the README's command and the gate)
def test_passkey_run_stores_every_sample_with_provenance(smollm, tmp_path):
    cfg = config(tmp_path, "run.limit=3", "task.context_length=512")
    [summary] = runner.run(cfg)
    assert summary.n == 3 and summary.computed == 3
    assert summary.accuracy == 1.0  # the embedded model retrieves short passkeys with the full cache
    frame = load(tmp_path / "db.sqlite")
    assert len(frame) == 3
    assert set(frame["method"]) == {"full"}
    assert (frame["prompt_tokens"].between(480, 512)).all()
    assert (frame["kv_bytes"] > 0).all() and (frame["generated_tokens"] > 0).all()
    assert frame["output"].str.contains(r"\d{7}").all()


def test_snapstream_with_budget_over_prompt_gives_the_full_cache_outputs(tiny, tmp_path, one_torch_thread):
    [full] = runner.run(config(tmp_path, *tiny, "run.limit=2", "task.context_length=512"))
    [snap] = runner.run(config(tmp_path, *tiny, "run.limit=2", "task.context_length=512", "cache=snapstream"))
    assert full.config_hash != snap.config_hash
    with ResultsDB(tmp_path / "db.sqlite") as db:
        outputs = [{r["sample_id"]: r["output"] for r in db.samples_for(s.config_hash)} for s in (full, snap)]
        answered_by = db.engine.connect().execute(select(runs.c.engine)).scalars().all()
    assert outputs[0] == outputs[1]
    assert answered_by == [{"backend": "snapeval", "weights": "float32"}] * 2  # how the weights ran


def test_rerun_computes_only_missing_samples_and_survives_interruption(tiny, tmp_path, monkeypatch):
    overrides = (*tiny, "task.context_length=512", "cache=snapstream", "cache.budget=256")
    stored = []
    real_store = Evaluation.commit

    def interrupted_after_one(*args, **kwargs):
        if stored:
            raise KeyboardInterrupt
        stored.append(1)
        return real_store(*args, **kwargs)

    monkeypatch.setattr(Evaluation, "commit", interrupted_after_one)
    with pytest.raises(KeyboardInterrupt):
        runner.run(config(tmp_path, "run.limit=3", *overrides))
    monkeypatch.setattr(Evaluation, "commit", real_store)
    frame = load(tmp_path / "db.sqlite")
    assert len(frame) == 1 and frame["status"].iloc[0] == "interrupted"

    [resumed] = runner.run(config(tmp_path, "run.limit=3", *overrides))
    assert (resumed.n, resumed.computed) == (3, 2)
    [extended] = runner.run(config(tmp_path, "run.limit=4", *overrides))
    assert (extended.n, extended.computed) == (4, 1)
    assert load(tmp_path / "db.sqlite")["sample_id"].nunique() == 4


def test_several_sampled_answers_per_prompt_are_stored_as_draws(tiny, tmp_path):
    cfg = config(
        tmp_path,
        *tiny,
        "run.limit=2",
        "task.context_length=256",
        "generation.num_samples=5",
        "generation.do_sample=true",
        "generation.temperature=0.7",
        "task.max_new_tokens=8",
    )
    [summary] = runner.run(cfg)
    frame = load(tmp_path / "db.sqlite")
    assert summary.n == 10 and sorted(frame["sample_id"])[0].endswith("#0")
    assert {extra["draw"] for extra in frame["extra"]} == set(range(5))
    correct = frame.groupby(frame["sample_id"].str.split("#").str[0])["score"].sum()
    assert summary.pass_at == {"pass@5": pytest.approx(sum(c > 0 for c in correct) / 2)}  # n = k: any pass
    assert "pass@5" in run_table([summary])
    for extra, generated in zip(frame["extra"], frame["generated_tokens"], strict=True):
        trace = extra["trace"]
        assert trace["generated_tokens"] == generated <= 8
        assert trace["truncated"] == (trace["stopped"] == "length") == (generated == 8)
        assert trace["reasoning_closed"] is False and trace["ring_wraps"] == 0  # full cache: no ring


def test_sampled_draws_in_rows_equal_draws_decoded_one_at_a_time(tiny, tmp_path, one_torch_thread):
    """Rows of the continuous batcher (3 draws sharing a prefill, a ring that wraps) == batch size 1."""
    draws = (*tiny, "run.limit=2", "task.context_length=256", "task.max_new_tokens=40")
    draws += ("generation.num_samples=3",)
    sampled = ("generation.do_sample=true", "generation.temperature=0.8")
    sampled += ("cache=snapstream", "cache.budget=128", "cache.ring=16")
    [together] = runner.run(config(tmp_path / "a", *draws, *sampled, "run.batch_size=4"))
    [one_by_one] = runner.run(config(tmp_path / "b", *draws, *sampled, "run.batch_size=1"))
    assert together.config_hash == one_by_one.config_hash  # batch_size changes how, not what
    a, b = (load(path / "db.sqlite").sort_values("sample_id") for path in (tmp_path / "a", tmp_path / "b"))
    assert list(a["output"]) == list(b["output"])
    assert len(set(a["output"])) >= 4  # draws differ (two of one problem may agree)
    assert [x["trace"] for x in a["extra"]] == [x["trace"] for x in b["extra"]]
    assert any(x["trace"]["ring_wraps"] > 0 for x in a["extra"])
    assert list(a["kv_bytes"]) == list(b["kv_bytes"]) == [TINY_KV_BYTES] * 6  # one row's slots


def test_prompts_in_rows_equal_prompts_decoded_one_by_one(tiny, tmp_path, one_torch_thread):
    setting = (*tiny, "run.limit=3", "task.context_length=384", "task.max_new_tokens=12")
    setting += ("cache=snapstream", "cache.budget=128", "cache.window=8")
    [batched] = runner.run(config(tmp_path / "a", *setting, "run.batch_size=2"))
    [one_by_one] = runner.run(config(tmp_path / "b", *setting, "run.batch_size=1"))
    assert batched.config_hash == one_by_one.config_hash
    a, b = (load(path / "db.sqlite").sort_values("sample_id") for path in (tmp_path / "a", tmp_path / "b"))
    assert list(a["output"]) == list(b["output"])
    assert list(a["prompt_tokens"]) == list(b["prompt_tokens"])
    assert [extra["kept_histogram"] for extra in a["extra"]] == [
        extra["kept_histogram"] for extra in b["extra"]
    ]
    assert list(a["kv_bytes"]) == list(b["kv_bytes"]) == [TINY_KV_BYTES] * 3


def test_runner_answers_equal_the_plain_one_by_one_generator(tiny, tmp_path, one_torch_thread):
    """The stored output of a full-cache run == :func:`generate` on the same prompt, token for token."""
    from snapeval.cache import FullCache, install
    from snapeval.models import ModelSpec, load_model, load_tokenizer
    from snapeval.tasks import load_task

    cfg = config(tmp_path, *tiny, "run.limit=2", "task.context_length=256", "task.max_new_tokens=24")
    runner.run(cfg)
    spec = ModelSpec.from_config(cfg["model"])
    tokenizer, model = load_tokenizer(spec), install(load_model(spec))
    prompts = load_task(cfg["task"], cfg["seed"]).prompts(tokenizer)[:2]
    stored = load(tmp_path / "db.sqlite").sort_values("sample_id")
    for prompt, output in zip(sorted(prompts, key=lambda p: p.id), stored["output"], strict=True):
        ids = encode_chat(tokenizer, prompt.messages)
        plain = generate(model, ids, FullCache(), 24, {tokenizer.eos_token_id})
        assert len(plain.tokens) == 24 and tokenizer.decode(plain.tokens, skip_special_tokens=True) == output


def ended_pid() -> int:
    """The pid of a process of this host that has ended."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def disk_full() -> OperationalError:
    """What SQLAlchemy raises when SQLite finds the database's disk full."""
    return OperationalError(
        "INSERT INTO samples ...", {}, sqlite3.OperationalError("database or disk is full")
    )


@pytest.mark.parametrize("closing", ["closes", "fails too"])
def test_a_full_disk_mid_run_is_one_line_and_the_run_resumes(closing, tiny, tmp_path, monkeypatch, capsys):
    """The database's disk fills after the first sample (one row at a time): one line naming run.db, the
    database and the space left, exit code 2; the run closed as interrupted, its claims dropped. Where the
    full disk refuses that too, the run is stale once its worker has exited, and a resume takes its claims."""
    path = tmp_path / "db.sqlite"
    overrides = (*tiny, "run.limit=3", "task.context_length=256", "task.max_new_tokens=4", "run.batch_size=1")
    add_sample, finish_runs = ResultsDB.add_sample, ResultsDB.finish_runs

    def fills_up(db, *args):
        if db.done_sample_ids(args[1]):
            raise disk_full()
        return add_sample(db, *args)

    def refused(db, run_ids, status, error=None):
        if status == "interrupted":
            raise disk_full()
        finish_runs(db, run_ids, status, error)

    monkeypatch.setattr(ResultsDB, "add_sample", fills_up)
    if closing == "fails too":
        monkeypatch.setattr(ResultsDB, "finish_runs", refused)
    with pytest.raises(SnapevalError) as raised:
        runner.run(config(tmp_path, *overrides))
    capsys.readouterr()
    assert report(raised.value) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and line.startswith(
        f"error: run.db: cannot write to {path}: database or disk is full ("
    )
    assert " MiB free of " in line and line.endswith("the same command resumes the run\n")
    monkeypatch.undo()
    with ResultsDB(path) as db, db.engine.begin() as conn:
        status = conn.execute(select(runs.c.status)).scalar_one()
        claimed = conn.execute(select(func.count()).select_from(claims)).scalar_one()
        assert (status, claimed > 0) == (("interrupted", False) if closing == "closes" else ("running", True))
        conn.execute(update(runs).values(pid=ended_pid()))  # its worker has exited
    [resumed] = runner.run(config(tmp_path, *overrides))
    assert (resumed.n, resumed.computed) == (3, 2)
    with ResultsDB(path) as db, db.engine.connect() as conn:
        states = [run["status"] for run in db.run_states()]
        assert conn.execute(select(func.count()).select_from(claims)).scalar() == 0
    assert states == ["interrupted" if closing == "closes" else "stale", "finished"]
