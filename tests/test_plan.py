"""One checked run plan: the front door checks a run once, before Hydra starts it, and the runner executes
the plan without checking anything again; a grid's impossible point is set aside in the plan and
recorded as failed by the runner."""

from __future__ import annotations

import sys
from collections import Counter

import hydra
import pytest

import snapeval.__main__ as front_door
from snapeval import models, tasks
from snapeval.commands import evaluate
from snapeval.configs import compose
from snapeval.configs.compose import compose_config
from snapeval.results import ResultsDB
from snapeval.run import plan, runner


def counting(monkeypatch, counts: Counter, owner: object, name: str) -> None:
    """Count the calls of ``owner.name`` in ``counts`` (the function still runs)."""
    function = getattr(owner, name)

    def counted(*args, **kwargs):
        counts[name] += 1
        return function(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def test_the_front_door_checks_a_run_once(monkeypatch, tmp_path, tiny_llama_overrides, capsys):
    """``python -m snapeval ...`` in-process: the config is composed once (Hydra composes nothing
    again), its fields, its task (and data) and its cache settings are each checked once, and the
    model's config read once; the run then stores its samples."""
    counts: Counter = Counter()
    counting(monkeypatch, counts, compose, "compose")  # Hydra's composition, wherever it is asked for
    counting(monkeypatch, counts, hydra, "main")
    counting(monkeypatch, counts, plan, "check")
    counting(monkeypatch, counts, tasks, "load_task")
    counting(monkeypatch, counts, evaluate, "check_inputs")  # the path the front door shares
    counting(monkeypatch, counts, evaluate, "make_plan")
    counting(monkeypatch, counts, runner, "make_plan")  # the runner's own planning: not called
    models._read_config.cache_clear()
    overrides = [*tiny_llama_overrides, "run.limit=2", "task.context_length=256", "task.max_new_tokens=4"]
    overrides += [f"run.db={tmp_path / 'db.sqlite'}", "run.progress=false", f"hydra.run.dir={tmp_path}"]
    monkeypatch.setattr(sys, "argv", ["snapeval", *overrides])
    checked = front_door.check_before_hydra(overrides)
    front_door.main(checked)
    assert counts == {"compose": 1, "check": 1, "load_task": 1, "check_inputs": 1, "make_plan": 1}
    assert models._read_config.cache_info().misses == 1  # the plan checks it, the model is built from it
    with ResultsDB(tmp_path / "db.sqlite") as db:
        [stored] = db.run_states()
        assert stored["status"] == "finished" and len(db.samples_for(stored["config_hash"])) == 2
    assert "accuracy" in capsys.readouterr().out  # the run's table


def test_an_impossible_grid_point_is_set_aside_and_recorded_as_failed(tmp_path, tiny_llama_overrides):
    """A grid whose SnapStream point cannot hold its reserved slots: the plan runs the full cache and
    keeps the other point, with why, for the runner to record as failed."""
    grid = "grid={cache: [full, snapstream], params: {budget: 64}}"
    overrides = [*tiny_llama_overrides, "run.limit=1", "task.context_length=256", "task.max_new_tokens=2"]
    config = compose_config(*overrides, grid, f"run.db={tmp_path / 'db.sqlite'}", "run.progress=false")
    checked = plan.make_plan(config)
    assert [point.config["cache"]["method"] for point in checked.points] == ["full"]
    [(setting, why)] = checked.failed
    assert setting["cache"]["method"] == "snapstream"
    assert str(why) == (
        "cache.budget: must be an integer larger than cache.window + cache.sinks + cache.ring = 100, got 64"
    )
    [summary] = runner.execute(checked)
    assert summary.n == 1
    with ResultsDB(tmp_path / "db.sqlite") as db:
        assert sorted(run["status"] for run in db.run_states()) == ["failed", "finished"]


def test_a_plan_that_cannot_be_made_fails_in_one_line(tmp_path):
    config = compose_config("run.limit=0")
    with pytest.raises(Exception, match=r"^run\.limit: must be an integer >= 1 or null, got 0$"):
        plan.make_plan(config)
