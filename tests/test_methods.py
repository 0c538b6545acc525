"""One declaration per method: the registry, the config group generated from it, and a method added as
one module outside the package that runs end to end without touching any other file."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from snapeval.cache import build_cache, method_class, method_classes, method_label
from snapeval.errors import SnapevalError
from snapeval.figures import method_color
from snapeval.memory import estimate
from snapeval.method_configs import definition, stale
from snapeval.paths import CONF_DIR
from snapeval.results import load

TOY_MODULE = '''
import torch

from snapeval.cache.base import LayerPrompt, Selection, SnapevalCache
from snapeval.cache.scoring import top_columns


class FirstTokensCache(SnapevalCache):
    """Keeps the first ``budget`` prompt tokens; decode appends. Defaults: budget 8."""

    method = "first_tokens"
    label = "First tokens"

    def __init__(self, budget: int = 8) -> None:
        super().__init__()
        self.budget = budget

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return min(prompt_length, self.budget) + new_tokens

    def select(self, prompt: LayerPrompt) -> Selection:
        batch, heads, length, _ = prompt.keys.shape
        columns = torch.arange(length, dtype=torch.float32)
        priority = torch.where(prompt.valid, -columns, float("-inf"))[:, None].expand(batch, heads, length)
        return Selection(pinned=top_columns(priority, min(self.budget, length)))
'''
TOY = "toy_first_tokens:FirstTokensCache"


def test_built_in_methods_are_the_modules_of_the_engine():
    assert list(method_classes()) == [
        "full",
        "kvpress",
        "sage_kv",
        "snapkv",
        "snapstream",
        "speculative_prefill",
        "streaming_llm",
    ]
    assert [method_label(m) for m in method_classes()] == [
        "Full cache",
        "kvpress",
        "SAGE-KV",
        "SnapKV",
        "SnapStream",
        "Speculative prefill",
        "StreamingLLM",
    ]
    for cls in method_classes().values():
        assert inspect.getdoc(cls), f"{cls.__name__} states its algorithm in its docstring"


def test_the_config_group_is_generated_from_the_classes():
    assert stale() == [], "run `python -m snapeval.method_configs`"
    snapstream = yaml.safe_load((CONF_DIR / "cache" / "snapstream.yaml").read_text())
    assert snapstream == {
        "method": "snapstream",
        "budget": 1024,
        "ratio": None,
        "window": 32,
        "kernel": 7,
        "pooling": "max",
        "sinks": 4,
        "ring": 64,
        "gqa_reduce": "mean",
    }
    full = yaml.safe_load(definition("full"))
    assert full == {"method": "full", "budget": None, "ratio": None}  # one sweep gives every method a budget


def test_a_config_option_without_a_method_is_stale(tmp_path):
    for method in method_classes():
        (tmp_path / f"{method}.yaml").write_text(definition(method))
    (tmp_path / "h2o.yaml").write_text("method: h2o\n")
    (tmp_path / "snapkv.yaml").write_text(definition("snapkv").replace("window: 32", "window: 16"))
    assert stale(tmp_path) == ["snapkv", "h2o"]


@pytest.fixture
def toy_module(tmp_path, monkeypatch):
    (tmp_path / "toy_first_tokens.py").write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_outside_method_loads_by_its_import_path(toy_module):
    cache = build_cache({"method": TOY, "budget": 5})
    assert cache.params() == {"method": TOY, "budget": 5}  # stored under the path that loads it again
    assert method_label(TOY) == "First tokens"
    assert method_color(TOY) not in {method_color(m) for m in method_classes()}  # told apart in figures
    memory = estimate("smollm2-135m", "sn40l", context=4096, budget=16, method=TOY)
    assert memory.tokens_compressed == 16 and memory.reduction == 256.0
    with pytest.raises(SnapevalError, match=r"cache\.method: cannot load 'toy_first_tokens:Nope'"):
        method_class("toy_first_tokens:Nope")


def test_an_outside_method_runs_end_to_end_without_touching_another_file(toy_module):
    """The toy method in a temporary module, through the command line, the runner and the database."""
    database = toy_module / "db.sqlite"
    overrides = ["cache=full", f"cache.method={TOY}", "cache.budget=16", "task.context_length=256"]
    overrides += ["run.limit=2", "task.max_new_tokens=8", f"run.db={database}", "run.progress=false"]
    done = subprocess.run(
        [sys.executable, "-m", "snapeval", *overrides],
        cwd=toy_module,
        env={**os.environ, "PYTHONPATH": str(toy_module)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{TOY}(budget=16)" in done.stdout
    samples = load(database)
    assert len(samples) == 2 and set(samples["method"]) == {TOY}
    for extra in samples["extra"]:
        counts = extra["kept_histogram"]["counts"]
        assert counts[0] > 0.5 and sum(counts[1:]) == 0  # only the first 16 of ~250 prompt tokens held
