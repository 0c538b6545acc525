"""``snapeval.evaluate(...)``: the Python entry point runs what ``python -m snapeval`` runs, into the same
rows, and refuses bad input in one line before torch loads."""

from __future__ import annotations

import runpy
import subprocess
import sys

import pytest

import snapeval
from snapeval.errors import SnapevalError
from snapeval.results import load

COMPARED = ["sample_id", "config_hash", "prompt_tokens", "output", "target", "score", "generated_tokens"]


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # snapeval.__main__, run again
def test_evaluate_stores_the_rows_the_command_line_stores(monkeypatch, tmp_path, tiny_llama_overrides):
    common = [*tiny_llama_overrides, "cache.budget=128", "run.limit=2", "task.context_length=256"]
    common += ["task.max_new_tokens=4", "run.progress=false"]
    cli_db, api_db = tmp_path / "cli.sqlite", tmp_path / "api.sqlite"
    argv = ["snapeval", "task=ruler_niah_single", "cache=snapstream", f"run.db={cli_db}", *common]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_module("snapeval", run_name="__main__", alter_sys=True)  # python -m snapeval, in-process
    from_cli = load(cli_db)[COMPARED]

    samples = snapeval.evaluate(task="ruler_niah_single", cache="snapstream", db=api_db, overrides=common)

    assert len(from_cli) == 2 and from_cli["output"].str.len().min() > 0
    assert samples[COMPARED].to_dict("records") == from_cli.to_dict("records")
    assert (
        samples["cache.method"].tolist() == ["snapstream"] * 2
        and samples["cache.budget"].tolist() == [128] * 2
    )
    assert load(api_db)[COMPARED].to_dict("records") == from_cli.to_dict(
        "records"
    )  # what it returned is stored
    again = snapeval.evaluate(task="ruler_niah_single", cache="snapstream", db=api_db, overrides=common)
    assert again[COMPARED].to_dict("records") == from_cli.to_dict("records")  # resumed: nothing new
    assert len(load(api_db)) == 2


@pytest.mark.parametrize(
    "options,line",
    [
        ({"task": "nope"}, "task: unknown option 'nope'; choose one of aime24, "),
        ({"overrides": ["run.limit=abc"]}, "run.limit: must be an integer >= 1 or null, got 'abc'"),
        (
            {"cache": "snapstream", "overrides": ["cache.budgt=5"]},
            "cache.budgt: unknown key; snapstream takes",
        ),
        ({"model": 3}, "model: must be a non-empty string, got 3"),
        (
            {"overrides": "run.limit=2"},
            "overrides: must be a list of strings like ['run.limit=2'], got 'run.limit=2'",
        ),
        (
            {"overrides": ["-m", "cache=full,snapkv"]},
            "overrides: -m is a command-line flag; evaluate runs one job",
        ),
        ({"exp": "memory_sweep"}, "exp: this experiment sweeps: run it with python -m snapeval"),
        (
            {"overrides": ["job=memory"]},
            "job: evaluate runs evaluations; run job=memory with python -m snapeval",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_field_and_leaves_no_database(tmp_path, options, line):
    db = tmp_path / "db.sqlite"
    with pytest.raises(SnapevalError) as refused:
        snapeval.evaluate(db=db, **options)
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)
    assert not db.exists()


def test_a_refusal_comes_before_torch_and_importing_the_package_loads_nothing(tmp_path, torch_refused):
    probe = (
        "import sys, snapeval\n"
        "loaded = ('torch', 'pandas', 'hydra', 'snapeval.commands.evaluate')\n"
        "heavy = [m for m in loaded if m in sys.modules]\n"
        "try:\n"
        "    snapeval.evaluate(task='ruler_passkey', overrides=['task.context_length=abc'])\n"
        "except snapeval.errors.SnapevalError as error:\n"
        "    print(heavy, error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=torch_refused,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[] task.context_length: must be an integer >= 16, got 'abc'"
