"""The task registry: every config served by one module, lm-eval definitions generated from both, a new
benchmark added as one module, and results stored before the registry still resumed."""

from __future__ import annotations

import pkgutil
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import snapeval.tasks
from snapeval.configs import task as task_schemas
from snapeval.configs.compose import compose_config
from snapeval.configs.fields import Checked, setting
from snapeval.configs.task import SCHEMAS, TaskConfig, option, task_options, task_schema
from snapeval.errors import SnapevalError
from snapeval.paths import LM_EVAL_TASKS_DIR
from snapeval.tasks import load_task, task_class, task_names
from snapeval.tasks.lm_eval_export import definition, exported_names, stale

TOY = '''
from snapeval.tasks.base import Task


class Reverse(Task):
    """Answer with the word reversed."""

    names = ("toy_reverse",)
    metrics = ("exact",)

    def rows(self, tokenizer=None):
        return [{"word": word} for word in ("snap", "stream", "cache")]

    def user_text(self, row):
        return f"Reverse the word {row['word']}."

    def target(self, row):
        return row["word"][::-1]

    def score_row(self, row, output):
        fold = str.lower if self.metadata["case"] == "insensitive" else str
        return {"exact": float(fold(output.strip()) == fold(row["word"][::-1]))}
'''


def test_every_task_config_is_served_by_one_module() -> None:
    names = task_names()
    assert {"aime24", "livecodebench", "longbench_v2", "longbench_v2_cot", "ruler_passkey"} <= set(names)
    for name in names:
        cls = task_class(name)
        assert name in cls.names and cls.__module__.startswith("snapeval.tasks.")
        task = load_task(compose_config(f"task={name}")["task"], seed=0)
        assert task.max_new_tokens == compose_config(f"task={name}")["task"]["max_new_tokens"]
    with pytest.raises(SnapevalError, match="^task.name: no task module in snapeval/tasks serves 'nope'"):
        task_class("nope")


def test_lm_eval_definitions_are_generated_from_the_registry() -> None:
    assert stale() == [], "run `python -m snapeval.tasks.lm_eval_export`"
    livecodebench = definition("livecodebench")
    assert "max_gen_toks: 512" in livecodebench  # conf/task/livecodebench.yaml, the one place
    assert '{metric: "passed", aggregation: mean' in livecodebench
    exported = exported_names()
    assert sorted(p.stem for p in LM_EVAL_TASKS_DIR.glob("*.yaml")) == [f"snapeval_{n}" for n in exported]
    assert set(task_names()) - set(exported) == {"ruler_niah_multiturn", "ruler_vt_multiturn", "scbench"}


@dataclass
class ToyMetadata(Checked):
    path = "task.metadata"

    case: str = option(("sensitive", "insensitive"), help="whether case counts")


@dataclass
class ToyTask(TaskConfig):
    module = "toy"

    metadata: ToyMetadata = setting(ToyMetadata)


def test_every_schema_names_the_module_that_serves_its_configs() -> None:
    """One rule finds a config's schema and its module; each schema names the module that rule finds."""
    modules = {module.name for module in pkgutil.iter_modules(snapeval.tasks.__path__)}
    assert set(SCHEMAS) <= modules
    assert set(SCHEMAS) == {"aime24", "livecodebench", "longbench_v2", "ruler", "scbench"}
    for name in task_names():
        served_by = task_class(name).__module__
        assert served_by.split(".")[2] == task_schema(name).module, name
        options = task_options(name)
        assert set(options) <= set(compose_config(f"task={name}")["task"].get("metadata", {})), name


def test_a_new_benchmark_is_one_module_and_its_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module dropped next to the others is found by its config name, options checked, scored."""
    (tmp_path / "toy.py").write_text(TOY)
    monkeypatch.setattr(task_schemas, "SCHEMAS", {**SCHEMAS, "toy": ToyTask})
    monkeypatch.setattr(snapeval.tasks, "__path__", [*snapeval.tasks.__path__, str(tmp_path)])
    monkeypatch.syspath_prepend(str(tmp_path.parent))
    sys.modules.pop("snapeval.tasks.toy", None)
    try:
        config = {"name": "toy_reverse", "max_new_tokens": 8, "metadata": {"case": "insensitive"}}
        task = load_task(config, seed=0)
        prompts = task.prompts(tokenizer=None)
        assert [p.messages for p in prompts][0] == [{"role": "user", "content": "Reverse the word snap."}]
        assert [p.target for p in prompts] == ["pans", "maerts", "ehcac"]
        assert task.score(prompts[0], " PANS\n") == {"score": 1.0, "exact": 1.0}
        with pytest.raises(SnapevalError, match="^task.metadata.case: unknown value 'loose'"):
            load_task({**config, "metadata": {"case": "loose"}}, seed=0)
    finally:
        sys.modules.pop("snapeval.tasks.toy", None)


BEFORE = Path(__file__).parent / "data" / "before_task_registry.sqlite"


def test_runs_stored_before_the_registry_resume_after_migrate(tmp_path: Path, monkeypatch) -> None:
    """A database written by snapeval before the task registry (ruler_passkey, 3 samples; its configs
    hold ``task.family``): ``python -m snapeval.results migrate`` re-keys it, then the same run computes
    nothing (no model loads) and reads the stored outputs."""
    from snapeval.results import load
    from snapeval.results.__main__ import main as results_cli
    from snapeval.run import evaluation, runner

    db = tmp_path / "db.sqlite"
    shutil.copy(BEFORE, db)
    before = load(db)
    assert before["task.family"].eq("synthetic").all()
    assert results_cli(["migrate", "--db", str(db)]) == 0
    assert results_cli(["migrate", "--db", str(db)]) == 0  # idempotent
    overrides = ("run.limit=3", "task.context_length=256", "task.max_new_tokens=8", "run.progress=false")
    monkeypatch.setattr(
        evaluation, "load_model", lambda *args: pytest.fail("the model loaded: nothing to do")
    )
    [summary] = runner.run(compose_config(*overrides, f"run.db={db}"))
    assert (summary.n, summary.computed) == (3, 0)
    after = load(db)
    assert "task.family" not in after.columns
    assert list(after["output"]) == list(before["output"]) and list(after["score"]) == list(before["score"])
