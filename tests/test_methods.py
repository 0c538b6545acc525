"""One declaration per method: its parameters' dataclass (torch-free, the config group's option) and its
engine class, and a method added as one module outside the package that runs end to end without
touching any other file."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from snapeval.cache import build_cache, method_class, method_classes, method_label
from snapeval.configs.compose import compose_config
from snapeval.configs.methods import METHODS, effective_params, parameter_names
from snapeval.errors import SnapevalError
from snapeval.figures import method_color
from snapeval.grid import grid_points
from snapeval.memory import estimate
from snapeval.results import load

TOY_MODULE = '''
from dataclasses import dataclass

import torch

from snapeval.cache.base import LayerPrompt, Selection, SnapevalCache
from snapeval.cache.scoring import top_columns
from snapeval.errors import SnapevalError


@dataclass
class FirstTokens:
    """Keeps the first ``budget`` prompt tokens; decode appends. Defaults: budget 8."""

    method: str = "first_tokens"
    budget: int = 8

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise SnapevalError(f"must be an integer >= 1, got {self.budget}", "cache.budget")


class FirstTokensCache(SnapevalCache):
    """Keeps the first ``budget`` prompt tokens; decode appends."""

    method = "first_tokens"
    label = "First tokens"
    params_class = FirstTokens

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return min(prompt_length, self.budget) + new_tokens

    def select(self, prompt: LayerPrompt) -> Selection:
        batch, heads, length, _ = prompt.keys.shape
        columns = torch.arange(length, dtype=torch.float32)
        priority = torch.where(prompt.valid, -columns, float("-inf"))[:, None].expand(batch, heads, length)
        return Selection(pinned=top_columns(priority, min(self.budget, length)))
'''
TOY = "toy_first_tokens:FirstTokensCache"


def test_built_in_methods_are_the_modules_of_the_engine_each_with_its_parameters():
    assert (
        list(method_classes())
        == list(METHODS)
        == [
            "full",
            "kvpress",
            "rkv",
            "sage_kv",
            "snapkv",
            "snapstream",
            "speculative_prefill",
            "streaming_llm",
        ]
    )
    assert [method_label(m) for m in method_classes()] == [
        "Full cache",
        "kvpress",
        "R-KV",
        "SAGE-KV",
        "SnapKV",
        "SnapStream",
        "Speculative prefill",
        "StreamingLLM",
    ]
    for name, cls in method_classes().items():
        assert cls.params_class is METHODS[name], f"{cls.__name__} takes its parameters from {name}'s"
        assert inspect.getdoc(cls), f"{cls.__name__} states its algorithm in its docstring"


def stated_defaults(params: type) -> dict[str, str]:
    """The parameters and values a dataclass's docstring states in its "Defaults: a 1, b x." sentence."""
    doc = " ".join(inspect.getdoc(params).split())
    sentence = re.sub(r" \(.*?\)", "", doc.partition("Defaults: ")[2]).split(". ")[0].rstrip(".")
    return dict(pair.split(" ", 1) for pair in sentence.split(", ")) if sentence else {}


@pytest.mark.parametrize("method", list(METHODS))
def test_a_method_runs_with_the_defaults_its_docstring_states(method):
    """The docstring's defaults are the config option's, and the engine built without arguments runs
    with them: a budgeted method holds 1024 slots of a 5000-token prompt (R-KV its buffer's 128 more),
    kvpress half, full all."""
    params = METHODS[method]
    option = dataclasses.asdict(params())
    assert option["method"] == method and {"budget", "ratio"} <= set(option)  # a sweep budgets every method
    stated = stated_defaults(params)
    assert list(stated) == [name for name in parameter_names(params) if name != "ratio"]
    declared = {f.name: f.default for f in dataclasses.fields(params)}
    for name, value in stated.items():
        default = declared[name]
        written = (
            "null" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        )
        assert written == value, f"{params.__name__}.{name}: the docstring says {value}"
    if method == "kvpress":
        pytest.importorskip("kvpress")
    engine = build_cache({"method": method})
    assert engine.params() == effective_params(option)
    expected = {"full": 5000, "kvpress": 2500, "rkv": 1024 + 128}.get(method, 1024)
    assert engine.decode_slots(5000, 0) == expected


def test_a_grid_point_is_stored_as_that_point_run_alone():
    """A number field is a number however it is written: ``ratio: 1`` in a grid (untyped) and
    ``cache.ratio=1`` (composed as 1.0) are one config, under one hash."""
    alone = compose_config("cache=snapkv", "cache.budget=null", "cache.ratio=1", "cache.window=16")
    grid = "grid={cache: [full, snapkv], params: {budget: null, ratio: 1, window: 16}}"
    full, point = grid_points(compose_config(grid))
    stored = [json.dumps(effective_params(config["cache"])) for config in (alone, point)]
    assert (
        stored[0]
        == stored[1]
        == (
            '{"method": "snapkv", "budget": null, "ratio": 1.0, "window": 16, "kernel": 7, "pooling": "max", '
            '"gqa_reduce": "mean"}'
        )
    )
    assert effective_params(full["cache"]) == {"method": "full"}


def test_a_bad_parameter_is_refused_without_importing_torch(torch_refused):
    """The parameters, their checks, the stored form and the grid's points need no torch."""
    code = """
import sys
from snapeval.configs.methods import check_cache, effective_params
from snapeval.errors import SnapevalError
from snapeval.grid import grid_points
print(effective_params({"method": "snapstream", "budget": 256, "window": 16}))
grid = {"cache": ["full", "snapkv"], "params": {"budget": [64, 128]}}
print(len(grid_points({"cache": {"method": "full", "budget": None, "ratio": None}, "grid": grid})))
try:
    check_cache({"method": "snapstream", "budget": 96})
except SnapevalError as error:
    print(error)
print("torch" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], env=torch_refused, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "{'method': 'snapstream', 'budget': 256, 'ratio': None, 'window': 16, 'kernel': 7, 'pooling': 'max', "
        "'sinks': 4, 'ring': 64, 'gqa_reduce': 'mean'}",
        "3",  # the full cache ignores the budget: one point, then snapkv's two
        "cache.budget: must be an integer larger than cache.window + cache.sinks + cache.ring = 100, got 96",
        "False",
    ]


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


def test_an_outside_method_runs_end_to_end_without_touching_another_file(toy_module, tiny_llama_overrides):
    """The toy method in a temporary module, through the command line, the runner and the database (a
    random-weight model: the path is under test, not the answers)."""
    database = toy_module / "db.sqlite"
    overrides = [*tiny_llama_overrides, "cache=full", f"cache.method={TOY}", "cache.budget=16"]
    overrides += ["task.context_length=256"]
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
