"""The real benchmarks end to end through the runner and ../shared/data: LongBench v2's truncation and
two-pass chain-of-thought on a tiny random-weight Llama with SmolLM2's tokenizer (what is checked is how
prompts are fitted, passed and scored, not the answers); (slow) every benchmark on the embedded model."""

from __future__ import annotations

import pytest

from snapeval.models import encode_chat, load_tokenizer
from snapeval.results import load
from snapeval.run import runner
from snapeval.tasks import load_task
from snapeval.tasks import longbench_v2 as lb
from snapeval.tasks.longbench_v2 import LONGBENCH_V2
from snapeval.tasks.rows import load_rows

from .conftest import SMOLLM2, compose_config
from .paths import SHARED_DATA, needs_shared_data

pytestmark = needs_shared_data


@pytest.fixture(autouse=True)
def shared_data(monkeypatch):
    monkeypatch.setenv("SNAPEVAL_DATA_DIR", str(SHARED_DATA))


def run(tmp_path, *overrides):
    return runner.run(compose_config(f"run.db={tmp_path / 'db.sqlite'}", "run.progress=false", *overrides))


def test_longbench_v2_truncated_to_the_window_query_agnostic(tiny_llama_overrides, tmp_path):
    [summary] = run(
        tmp_path,
        *tiny_llama_overrides,
        "task=longbench_v2",
        "run.limit=1",
        "model.max_context=1024",
        "task.max_new_tokens=16",
        "task.compression=query_agnostic",
        "cache=snapstream",
        "cache.budget=256",
    )
    frame = load(tmp_path / "db.sqlite")
    assert summary.n == 1
    assert frame["prompt_tokens"].iloc[0] <= 1024 - 16
    assert frame["extra"].iloc[0]["compressed_prompt_tokens"] < frame["prompt_tokens"].iloc[0]
    row = next(row for row in load_rows(LONGBENCH_V2) if row["_id"] == frame["sample_id"].iloc[0])
    assert frame[f"metric.acc_{row['difficulty']}"].iloc[0] == frame["metric.acc"].iloc[0] == summary.accuracy
    assert (
        frame["kv_bytes"].iloc[0] == 256 * 2 * 2 * 16 * 2 * 4
    )  # slots x layers x KV heads x dim x K,V x fp32


def test_longbench_v2_cot_answers_from_its_reasoning_without_the_document(tiny_llama_overrides, tmp_path):
    [summary] = run(
        tmp_path,
        *tiny_llama_overrides,
        "task=longbench_v2_cot",
        "run.limit=1",
        "model.max_context=1024",
        "task.max_new_tokens=24",
        "task.answer_pass.max_new_tokens=16",
        "cache=snapstream",
        "cache.budget=256",
    )
    sample = load(tmp_path / "db.sqlite").iloc[0]
    row = next(row for row in load_rows(LONGBENCH_V2) if row["_id"] == sample["sample_id"])
    reasoning_call, answer_call = sample["extra"]["calls"]
    answer_prompt = lb.build_cot_answer_prompt(row, sample["extra"]["reasoning"])
    assert "The text is too long and omitted here." in answer_prompt
    assert answer_call["prompt_tokens"] == len(
        encode_chat(load_tokenizer(SMOLLM2), [{"role": "user", "content": answer_prompt}])
    )
    assert reasoning_call["prompt_tokens"] == sample["prompt_tokens"] <= 1024 - 24
    assert sample["generated_tokens"] == reasoning_call["generated_tokens"] + answer_call["generated_tokens"]
    assert summary.accuracy == sample["metric.acc"] == lb.score(sample["output"], row)["acc"]


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["full", "snapstream"])
@pytest.mark.parametrize("task", ["aime24", "longbench_v2", "livecodebench"])
def test_each_benchmark_runs_under_full_and_snapstream(smollm, tmp_path, task, cache):
    overrides = [f"task={task}", "run.limit=2", "task.max_new_tokens=64", f"cache={cache}"]
    if task == "longbench_v2":
        overrides.append("model.max_context=2048")
    [summary] = run(tmp_path, *overrides)
    frame = load(tmp_path / "db.sqlite")
    assert summary.n == 2 and len(frame) == 2
    task_config = compose_config(*overrides)["task"]
    built = load_task(task_config, seed=0)
    rows = {str(row[built.id_field]): row for row in built.rows(None)}
    for sample in frame.itertuples():  # each stored score is its row's, re-scored from the stored output
        assert sample.score == built.score_row(rows[sample.sample_id], sample.output)[built.metrics[0]]
    assert summary.accuracy == frame["score"].mean()
