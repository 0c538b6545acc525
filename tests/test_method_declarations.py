"""The method declarations (snapeval/configs/cache.py) share what every method has (:class:`Method`) and
the groups of fields that methods share (:class:`Observation`) without changing what any method stores:
each method's defaults are stored as they were before the shared declarations (field order included: the
stored JSON and the methods table follow it), Hydra composes each option with those fields, the shared
classes are no methods, and a new method is one short declaration."""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

from snapeval.cache import effective_params
from snapeval.configs import cache as declarations
from snapeval.configs.cache import Method, Observation
from snapeval.configs.compose import compose_config
from snapeval.configs.fields import setting, slots
from snapeval.configs.methods import METHODS, declared_methods
from snapeval.errors import SnapevalError

ROOT = Path(__file__).resolve().parents[1]

STORED_DEFAULTS = {
    "full": {"method": "full"},
    "kvpress": {
        "method": "kvpress",
        "budget": None,
        "compression_ratio": 0.5,
        "press": "SnapKVPress",
        "press_args": "{}",
    },
    "rkv": {
        "method": "rkv",
        "budget": 1024,
        "buffer": 128,
        "window": 8,
        "kernel": 7,
        "mix_lambda": 0.1,
        "threshold": 0.5,
    },
    "sage_kv": {
        "method": "sage_kv",
        "budget": 1024,
        "ratio": None,
        "sinks": 4,
        "recent": 64,
        "window": 1,
        "gqa_reduce": "mean",
    },
    "snapkv": {
        "method": "snapkv",
        "budget": 1024,
        "ratio": None,
        "window": 32,
        "kernel": 7,
        "pooling": "max",
        "gqa_reduce": "mean",
    },
    "snapstream": {
        "method": "snapstream",
        "budget": 1024,
        "ratio": None,
        "window": 32,
        "kernel": 7,
        "pooling": "max",
        "sinks": 4,
        "ring": 64,
        "gqa_reduce": "mean",
    },
    "speculative_prefill": {
        "method": "speculative_prefill",
        "budget": 1024,
        "ratio": None,
        "draft": "self",
        "window": 8,
        "kernel": 13,
        "chunk": 32,
    },
    "streaming_llm": {
        "method": "streaming_llm",
        "budget": 1024,
        "ratio": None,
        "sinks": 4,
        "rerotate": False,
    },
}
"""What results stored of each method's defaults before the declarations shared their fields, in order."""


@pytest.mark.parametrize("method", list(STORED_DEFAULTS))
def test_each_method_stores_its_defaults_as_before_in_the_same_order(method):
    assert list(METHODS) == list(STORED_DEFAULTS)
    assert list(effective_params({"method": method}).items()) == list(STORED_DEFAULTS[method].items())


@pytest.mark.parametrize("method", list(STORED_DEFAULTS))
def test_hydra_composes_each_option_with_its_declared_fields(method):
    cache = compose_config(f"cache={method}")["cache"]
    assert list(cache) == [f.name for f in dataclasses.fields(METHODS[method])]
    assert list(effective_params(cache).items()) == list(STORED_DEFAULTS[method].items())


def test_the_shared_declarations_are_no_methods_and_every_method_is_one():
    assert Method not in METHODS.values() and Observation not in METHODS.values()
    assert declared_methods() == METHODS
    for name, declaration in METHODS.items():
        assert issubclass(declaration, Method), f"{name} declares budget and ratio as every method does"
        assert [f.name for f in dataclasses.fields(declaration)][:3] == ["method", "budget", "ratio"]


def test_a_ninth_method_is_one_short_declaration():
    """A method beside the built-in ones: its name, label and own fields; the budget, the ratio and the
    budget's check against its ``reserved`` fields come from :class:`Method`."""

    @dataclass
    class KeepLast(Method):
        """Keeps the last ``recent`` prompt tokens."""

        label = "Keep last"
        reserved = ("recent",)
        method: str = "keep_last"
        recent: int = setting(16, check=slots())

    module = types.SimpleNamespace(**vars(declarations), KeepLast=KeepLast)
    assert declared_methods(module) == {**METHODS, "keep_last": KeepLast}
    assert dataclasses.asdict(KeepLast()) == {
        "method": "keep_last",
        "budget": 1024,
        "ratio": None,
        "prefill_chunk": None,
        "kv_dtype": None,
        "recent": 16,
    }
    with pytest.raises(SnapevalError, match=r"^cache\.recent: must be an integer >= 1, got 0$"):
        KeepLast(recent=0)
    with pytest.raises(SnapevalError, match=r"^cache\.budget: .* larger than cache\.recent = 16, got 16$"):
        KeepLast(budget=16)
    assert KeepLast(budget=None, ratio=0.5).ratio == 0.5


def enumerations() -> dict[str, str]:
    """The prose that names the methods one by one rather than pointing at docs/methods.md: the package's
    description and the README's opening paragraph."""
    readme = (ROOT / "README.md").read_text().split("\n\n")[1]
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    return {"README.md's opening paragraph": readme, "pyproject.toml's description": description}


@pytest.mark.parametrize("where", list(enumerations()))
def test_a_list_of_the_methods_names_every_method(where):
    """A new method is named where the methods are listed (elsewhere the prose points at docs/methods.md)."""
    listed = " ".join(enumerations()[where].split()).lower()
    missing = [d.label for name, d in METHODS.items() if name != "full" and d.label.lower() not in listed]
    assert not missing, f"{where} does not name {', '.join(missing)}"
