"""One declaration per method: its torch-free dataclass (name, label, parameters: the config group's
option) and its engine class, everything else derived from the declaration; the method that
docs/methods.md adds (its code blocks run as the page has them) seen everywhere and running on a model;
and a method added as one module outside the package that runs end to end without touching any other
file."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from snapeval.cache import build_cache, method_class, method_classes
from snapeval.cache.attention import cache_keyword
from snapeval.configs.compose import compose_config
from snapeval.configs.grid import grid_points
from snapeval.configs.methods import (
    METHODS,
    declared_methods,
    method_label,
    method_table,
    register_caches,
)
from snapeval.configs.setting import effective_params
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.errors import SnapevalError
from snapeval.figures import method_color, method_style
from snapeval.memory import estimate
from snapeval.paths import CONF_DIR
from snapeval.results import load

TOY_MODULE = '''
from dataclasses import dataclass
from typing import ClassVar

import torch

from snapeval.cache.base import SnapevalCache
from snapeval.cache.method import LayerPrompt, Selection
from snapeval.cache.scoring import top_columns
from snapeval.errors import SnapevalError


@dataclass
class FirstTokens:
    """Keeps the first ``budget`` prompt tokens; decode appends."""

    label: ClassVar[str] = "First tokens"
    method: str = "first_tokens"
    budget: int = 8

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise SnapevalError(f"must be an integer >= 1, got {self.budget}", "cache.budget")


class FirstTokensCache(SnapevalCache):
    """Keeps the first ``budget`` prompt tokens; decode appends."""

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


@pytest.mark.parametrize("method", list(METHODS))
def test_a_method_runs_with_its_declared_defaults(method):
    """The config option is the declaration, and the engine built without arguments runs with its
    defaults: a budgeted method holds 1024 slots of a 5000-token prompt (R-KV its buffer's 128 more),
    kvpress half, full all."""
    params = METHODS[method]
    option = dataclasses.asdict(params())
    assert option["method"] == method and {"budget", "ratio"} <= set(option)  # a sweep budgets every method
    if method == "kvpress":
        pytest.importorskip("kvpress")
    engine = build_cache({"method": method})
    assert (engine.method, engine.label) == (method, params.label)
    assert engine.params() == effective_params(option)
    expected = {"full": 5000, "kvpress": 2500, "rkv": 1024 + 128}.get(method, 1024)
    assert engine.decode_slots(5000, 0) == expected


METHODS_PAGE = CONF_DIR.parent / "docs" / "methods.md"


def recipe_blocks() -> dict[str, str]:
    """The Python blocks of docs/methods.md's "Adding a method", by the file each names on its first line."""
    section = METHODS_PAGE.read_text().split("## Adding a method", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"```python\n# (\S+)\n(.*?)```", section, flags=re.DOTALL))


@pytest.fixture
def recipe(monkeypatch: pytest.MonkeyPatch) -> type:
    """The page's method added as the page says: its declaration run inside snapeval/configs/cache.py, its
    engine as the module snapeval/cache/first_tokens.py; the engine class."""
    from snapeval.configs import cache as declarations

    blocks = recipe_blocks()
    assert list(blocks) == ["snapeval/configs/cache.py", "snapeval/cache/first_tokens.py"]
    inside = dict(vars(declarations))
    exec(compile(blocks["snapeval/configs/cache.py"], str(METHODS_PAGE), "exec"), inside)
    monkeypatch.setattr(declarations, "FirstTokens", inside["FirstTokens"], raising=False)
    assert declared_methods().keys() - METHODS.keys() == {"first_tokens"}  # found there, not listed
    monkeypatch.setitem(METHODS, "first_tokens", declarations.FirstTokens)
    engine_module = types.ModuleType("snapeval.cache.first_tokens")
    monkeypatch.setitem(sys.modules, engine_module.__name__, engine_module)
    exec(compile(blocks["snapeval/cache/first_tokens.py"], str(METHODS_PAGE), "exec"), vars(engine_module))
    return engine_module.FirstTokensCache


def test_a_method_added_as_one_declaration_and_one_engine_is_seen_everywhere(recipe):
    """The recipe of docs/methods.md: the ConfigStore, the registry, the engine's name and label, figure
    labels and styles and the methods table all see it, and its checks refuse a bad budget."""
    assert (recipe.method, recipe.label) == ("first_tokens", "First tokens")
    option = dataclasses.asdict(recipe.params_class())
    assert {"budget", "ratio"} <= set(option)  # a sweep budgets every method
    assert method_classes()["first_tokens"] is recipe is method_class("first_tokens")
    stored = {}
    register_caches(types.SimpleNamespace(store=lambda group, name, node: stored.__setitem__(name, node)))
    assert stored["first_tokens"] is recipe.params_class
    assert method_label("first_tokens") == "First tokens"
    styles = [tuple(method_style(name).items()) for name in METHODS if name != "full"]
    assert len(set(styles)) == len(styles)  # its own colour, marker and dashes
    summary = "First tokens: keeps the first `budget` prompt tokens of every layer; decode appends."
    row = f"| `first_tokens` | First tokens | {summary} | grows after prefill | `budget` 8 | an example |"
    assert row in method_table().splitlines()
    assert effective_params({"method": "first_tokens", "budget": 3, "ratio": 0.5}) == {
        "method": "first_tokens",
        "budget": 3,
    }
    with pytest.raises(SnapevalError, match=r"^cache\.budget: must be an integer >= 1, got 0$"):
        build_cache({"method": "first_tokens", "budget": 0})


def test_the_docs_method_runs_on_a_model(recipe, tiny_llama):
    """The recipe's engine on a tiny random-weight Llama: a prefill keeps the first ``budget`` tokens of
    every layer and KV head, and the batcher answers with it in a row of ``budget`` + answer slots."""
    prompt = tuple(range(1, 41))
    cache = build_cache({"method": "first_tokens", "budget": 8})
    with torch.inference_mode():
        tiny_llama(torch.tensor([prompt]), **{cache_keyword(tiny_llama): cache})
    for layer in range(tiny_llama.config.num_hidden_layers):
        assert cache.kept_positions(layer).tolist() == [
            [list(range(8))] * tiny_llama.config.num_key_value_heads
        ]
    answers = []
    request = Request(prompt, {"method": "first_tokens", "budget": 8}, max_new_tokens=4)
    ContinuousBatcher(tiny_llama, 1).run([request], answers.append)
    [answer] = answers
    assert len(answer.tokens) == 4 and request.slots_needed == 8 + 4
    assert answer.kept_share == pytest.approx(8 / 40)


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
from snapeval.configs.setting import check_cache, effective_params
from snapeval.errors import SnapevalError
from snapeval.configs.grid import grid_points
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


def test_the_docs_method_table_is_the_declarations():
    """docs/methods.md holds the table :func:`method_table` derives from the declarations."""
    page = (CONF_DIR.parent / "docs" / "methods.md").read_text()
    assert method_table() in page, (
        "regenerate it: python -c 'from snapeval.configs.methods import method_table; print(method_table())'"
    )
