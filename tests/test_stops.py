"""A task's stop strings end generation in the runner (lcb_runner's ``###``, vLLM's ``stop``): a run
with a stop string taken from an unstopped answer ends right after it, with the same text before it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snapeval.configs.compose import compose_config
from snapeval.results import load
from snapeval.run import runner

PROBLEM = {
    "question_id": "add-one",
    "question_title": "Add one",
    "question_content": "Read an integer and print it plus one.",
    "platform": "atcoder",
    "contest_date": "2024-08-01T00:00:00",
    "starter_code": "",
    "public_test_cases": json.dumps([{"input": "3\n", "output": "4\n", "testtype": "stdin"}]),
    "private_test_cases": "[]",
    "metadata": "{}",
}


@pytest.fixture(scope="module")
def tiny_model(tiny_llama_folder: Path) -> Path:
    return tiny_llama_folder


def answer(tiny_model: Path, tmp_path: Path, stop: list[str], *overrides: str) -> tuple[str, int]:
    data = tmp_path / "problems.jsonl"
    data.write_text(json.dumps(PROBLEM) + "\n")
    cfg = compose_config(
        "task=livecodebench",
        *overrides,
        f"model.pretrained={tiny_model}",
        "model.gguf_file=null",
        "model.name=tiny-llama",
        f"task.metadata.data_path={data}",
        "task.max_new_tokens=48",
        f"run.db={tmp_path / 'db.sqlite'}",
        "run.progress=false",
    )
    cfg["task"]["stop"] = stop
    runner.run(cfg)
    row = load(tmp_path / "db.sqlite").iloc[-1]
    return row["output"], int(row["generated_tokens"])


def test_generation_ends_at_the_first_stop_string(tiny_model: Path, tmp_path: Path) -> None:
    full, full_tokens = answer(tiny_model, tmp_path, [])
    assert full_tokens == 48
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    first = full.find(stop)
    stopped, stopped_tokens = answer(tiny_model, tmp_path, [stop])
    assert stopped_tokens < full_tokens
    assert full.startswith(stopped)  # greedy: the same answer, cut short
    assert stopped.find(stop) == first  # it holds the stop string, once its last token is out
    assert len(stopped) < first + len(stop) + 16  # and ends within a token or so after it


def test_a_run_under_a_preset_names_its_deviations_first(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = ("+protocol=livecodebench_official", "generation.num_samples=1")
    answer(tiny_model, tmp_path, ["###"], *preset)
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        "protocol livecodebench_official: deviations from the official run: json_comparison; memory_cgroup; "
        "task.max_new_tokens=48 (preset: 2000); generation.num_samples=1 (preset: 10)"
    )
    stored = load(tmp_path / "db.sqlite").iloc[-1]
    assert stored["protocol.deviations"] == ["json_comparison", "memory_cgroup"]  # with every row
    assert stored["protocol.changed"] == [
        "task.max_new_tokens=48 (preset: 2000)",
        "generation.num_samples=1 (preset: 10)",
    ]
