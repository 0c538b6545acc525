"""The cache interface the snapeval attention drives (snapeval/cache/attended.py): every implementation has
each member with the declared signature, a member removed is found, and a step of the batcher's rows makes
the declared calls in the declared order, attending with the rows' own masks whatever the model's."""

from __future__ import annotations

import inspect

import pytest
import torch

from snapeval.cache import CacheGrid, build_cache, method_classes
from snapeval.cache.attended import AttendedCache, DecodeCall
from snapeval.cache.attention import cache_keyword
from snapeval.cache.base import SnapevalCache
from snapeval.decode.continuous.classes import RowClasses
from snapeval.decode.generation import prompt_logits
from tests.test_continuous import SNAPSTREAM, tiny  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

MEMBERS = sorted(name for name in vars(AttendedCache) if not name.startswith("_"))


def implementations() -> set[type]:
    """Every cache the attention is handed: a single sequence's (each method's, the grid's) and the rows."""
    return {SnapevalCache, CacheGrid, RowClasses, *method_classes().values()}


def missing(cls: type) -> list[str]:
    """The members of :class:`AttendedCache` that ``cls`` does not implement."""
    return [name for name in MEMBERS if not implements(cls, name)]


def implements(cls: type, name: str) -> bool:
    """Whether ``cls`` has member ``name``: present, not the declaration's own (abstract), and, for a
    method, with the parameters it declares."""
    declared, found = getattr(AttendedCache, name), getattr(cls, name, None)
    if found is None or getattr(found, "__isabstractmethod__", False):
        return False
    if not inspect.isfunction(declared):
        return True
    return inspect.signature(declared).parameters.keys() == inspect.signature(found).parameters.keys()


def test_the_interface_declares_what_the_attention_calls():
    assert MEMBERS == ["decode_parts", "note_attended", "record", "split_decode", "wants_layer_inputs"]


@pytest.mark.parametrize("cls", sorted(implementations(), key=lambda cls: cls.__name__))
def test_every_implementation_has_every_member(cls):
    assert issubclass(cls, AttendedCache)  # what the attention dispatches on
    assert missing(cls) == []


@pytest.mark.parametrize("name", MEMBERS)
def test_a_member_removed_from_an_implementation_is_found(monkeypatch, name):
    owner = next(cls for cls in RowClasses.__mro__ if name in vars(cls))
    if owner is AttendedCache:  # a default of the declaration (split_decode): none to remove
        assert not getattr(vars(AttendedCache)[name], "__isabstractmethod__", False)
        return
    monkeypatch.delattr(owner, name)
    assert missing(RowClasses) == [name]


def test_a_member_with_other_parameters_is_found(monkeypatch):
    monkeypatch.setattr(SnapevalCache, "note_attended", lambda self, layer: None)
    assert missing(SnapevalCache) == ["note_attended"]
    assert all("note_attended" in missing(cls) for cls in method_classes().values())


def layer_of(name: str, args: tuple) -> int:
    """The layer of a logged call of :class:`RowClasses`: ``update``'s third argument, ``decode_parts``'s
    call's, the others' first."""
    if name == "update":
        return args[2]
    return args[0].layer_idx if name == "decode_parts" else args[0]


def one_step(model, rows: RowClasses, token: int, model_mask: torch.Tensor) -> torch.Tensor:
    rows.begin_step()
    logits = model(
        input_ids=torch.tensor([[token], [token]]),
        position_ids=rows.seen[:, None],
        attention_mask=model_mask,
        **{cache_keyword(model): rows},
    ).logits[:, -1]
    rows.end_step()
    rows.check_step_attended()
    return logits


@torch.no_grad()
def test_a_step_of_the_rows_makes_the_declared_calls_and_reads_only_their_masks(tiny, monkeypatch):  # noqa: F811
    """Two classes of one row each, one full and one SnapStream: at every layer the model's cache takes
    the token (update), then the attention notes, attends each class with its masks and records; a model
    mask that hides every slot changes nothing (the attention never reads it at decode)."""
    prompt = torch.randint(0, 320, (60,), generator=torch.Generator().manual_seed(7)).tolist()
    caches = [build_cache({"method": "full"}), build_cache(SNAPSTREAM)]
    for cache in caches:
        prompt_logits(tiny, prompt, cache)
    rows = RowClasses.for_model(tiny, [(SNAPSTREAM["budget"], 1), (len(prompt) + 8, 1)], None)
    rows.load_row(0, caches[1], new_tokens=8)
    rows.load_row(1, caches[0], new_tokens=8)
    calls: list[tuple[str, int]] = []
    for name in ("update", "note_attended", "decode_parts", "record"):
        method = getattr(RowClasses, name)

        def logged(self, *args, _name=name, _method=method, **kwargs):
            calls.append((_name, layer_of(_name, args)))
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(RowClasses, name, logged)
    hidden = torch.zeros(2, 1, 1, 1, dtype=torch.bool)
    assert torch.equal(rows.model_mask, torch.ones(2, 1, 1, 1, dtype=torch.bool))
    twin = RowClasses.for_model(tiny, [(SNAPSTREAM["budget"], 1), (len(prompt) + 8, 1)], None)
    twin.load_row(0, caches[1], new_tokens=8)
    twin.load_row(1, caches[0], new_tokens=8)
    for token in (5, 9, 11):
        assert torch.equal(one_step(tiny, rows, token, rows.model_mask), one_step(tiny, twin, token, hidden))
    per_layer = ["update", "note_attended", "decode_parts", "record"]
    layers = tiny.config.num_hidden_layers
    assert calls[: 4 * layers] == [(name, layer) for layer in range(layers) for name in per_layer]
    assert len(calls) == 2 * 3 * 4 * layers  # two caches, three steps
    parts = rows.decode_parts(DecodeCall(0, None, None, torch.zeros(2, 4, 1, 16), None, None))
    assert [part.rows for part in parts] == [slice(0, 1), slice(1, 2)]
    assert [part.mask.shape[-1] for part in parts] == [SNAPSTREAM["budget"], len(prompt) + 8]
