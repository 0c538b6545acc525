"""Sweeps: every point recorded, a failing point recorded as failed while the sweep goes on, fidelity."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR
from snapeval.results import ResultsDB, load
from snapeval.run import runner
from snapeval.run.records import fidelity
from snapeval.run.sweep import count_points, sweep_table

from .conftest import compose_config, composed_sweep
from .families import smollm2_tokenizer


def test_failing_point_is_recorded_with_its_error(tmp_path):
    since = datetime.now(timezone.utc)
    cfg = compose_config(f"run.db={tmp_path / 'db.sqlite'}", "cache=snapstream", "cache.budget=50")
    with pytest.raises(SnapevalError):
        runner.run(cfg)
    with ResultsDB(tmp_path / "db.sqlite") as db:
        table = sweep_table(db, since)
    assert list(table["status"]) == ["failed"]
    assert "cache.budget" in table["error"].iloc[0]


def test_fidelity_counts_the_common_token_prefix():
    tokenizer = smollm2_tokenizer()
    same = fidelity(tokenizer, "The number is 1234567.", "The number is 1234567.")
    assert same == {"exact": True, "common_prefix_tokens": 12, "reference_tokens": 12}  # digits: 1 token each
    differ = fidelity(tokenizer, "The number is 7.", "The number is 1234567.")
    assert not differ["exact"] and differ["common_prefix_tokens"] == 4


def snapeval_cli(tmp_path: Path, model: tuple[str, str], *overrides: str) -> subprocess.CompletedProcess:
    """``python -m snapeval`` on one short passkey prompt, answered by ``model`` (its overrides)."""
    command = [sys.executable, "-m", "snapeval", *overrides, "run.limit=1", "task.context_length=256"]
    command += [*model, "task.max_new_tokens=4"]
    command += [
        "run.progress=false",
        f"run.db={tmp_path / 'db.sqlite'}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_multirun_goes_on_past_a_failing_point_and_summarizes(tmp_path, tiny_llama_overrides):
    result = snapeval_cli(
        tmp_path, tiny_llama_overrides, "-m", "task=ruler_passkey", "cache=full,snapstream", "cache.budget=50"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[sweep] point 2/2: " in result.stdout
    assert "[sweep] 2 points, 1 failed" in result.stdout
    [failed] = [line for line in result.stdout.splitlines() if "| snapstream(budget=50, " in line]
    assert "| failed " in failed and "| cache.budget: must be an integer larger than" in failed
    assert "error: cache.budget" in result.stderr
    frame = load(tmp_path / "db.sqlite")
    assert set(frame["method"]) == {"full"} and len(frame) == 1


def test_a_grid_goes_on_past_an_impossible_point_and_records_it(tmp_path, tiny_llama_overrides):
    result = snapeval_cli(tmp_path, tiny_llama_overrides, "+exp=smoke", "grid.params.budget=[50,256]")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "error: cache.budget" in result.stderr and "this grid point is skipped" in result.stderr
    assert "| snapstream(budget=256" in result.stdout and "| full " in result.stdout
    frame = load(tmp_path / "db.sqlite")
    assert sorted(frame["method"]) == ["full", "snapstream"]
    with ResultsDB(tmp_path / "db.sqlite") as db:
        runs = db.runs_since(datetime(2000, 1, 1))
    assert sorted(run["status"] for run in runs) == ["failed", "finished", "finished"]


def test_sweep_size_combines_the_sweeper_params_and_the_command_line():
    config = OmegaConf.create(
        {
            "hydra": {
                "sweeper": {
                    "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                    "params": {"cache": "full,snapstream", "cache.budget": "128,256,512", "seed": "0"},
                },
                "overrides": {"task": ["cache.budget=64,128", "seed=range(0,3)", "run.limit=2"]},
            }
        }
    )
    assert count_points(config) == 2 * 2 * 3  # the command line's budgets and seeds replace the params'


@pytest.mark.parametrize("experiment", sorted(path.stem for path in (CONF_DIR / "exp").glob("*.yaml")))
def test_every_point_of_every_shipped_sweep_composes_and_validates(experiment):
    """A sweep that cannot compose a point fails only after earlier points ran: catch it here (a budget
    search is one job: its rounds are grids of its own)."""
    points = composed_sweep(experiment)
    assert len(points) > 1 or [point["job"] for point in points] == ["search"]


def test_a_sweeps_jobs_load_their_model_once(tmp_path, tiny_llama_overrides, monkeypatch):
    """Hydra runs a sweep's jobs in one process: the second point finds the first one's model loaded."""
    from snapeval import __main__ as front_door
    from snapeval.run import evaluation

    loads = []
    real_load = evaluation.load_model
    monkeypatch.setattr(evaluation, "load_model", lambda spec: loads.append(spec) or real_load(spec))
    common = (*tiny_llama_overrides, f"run.db={tmp_path / 'db.sqlite'}", "run.limit=1", "run.progress=false")
    common += ("task=ruler_passkey", "task.context_length=256", "task.max_new_tokens=2")
    models: dict = {}
    for cache in ("cache=full", "cache=streaming_llm"):
        assert front_door.run_job(compose_config(*common, cache), None, True, models) == 0
    assert len(loads) == 1 and len(models) == 1
    assert set(load(tmp_path / "db.sqlite")["method"]) == {"full", "streaming_llm"}
