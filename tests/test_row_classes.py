"""The batcher's rows in capacity classes: a grid's compressed rows hold their own capacity, and every
answer stays the one-by-one answer (tests/test_continuous.py runs its mixed queues through classes too)."""

from __future__ import annotations

import pytest
import torch

from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.continuous.classes import MAX_CLASSES, plan_classes
from tests.test_continuous import alone, tiny  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_a_13_setting_grid_gets_a_class_per_budget_and_rows_per_request():
    needs = [8224, *[budget for budget in (256, 512, 1024, 2048) for _ in range(3)]]
    assert plan_classes(needs, 13) == [(256, 3), (512, 3), (1024, 3), (2048, 3), (8224, 1)]
    assert plan_classes(needs, 8) == [(256, 2), (512, 2), (1024, 2), (2048, 1), (8224, 1)]


def test_fewer_rows_than_sizes_merge_the_classes_that_waste_least():
    needs = [8224, *[budget for budget in (256, 512, 1024, 2048) for _ in range(3)]]
    # 256 into 512 wastes 3 x 256 slots, the least; then 512 into 1024 (6 x 512) beats 1024 into 2048
    assert plan_classes(needs, 4) == [(512, 1), (1024, 1), (2048, 1), (8224, 1)]
    assert plan_classes(needs, 3) == [(1024, 1), (2048, 1), (8224, 1)]
    assert plan_classes(needs, 1) == [(8224, 1)]


def test_near_capacities_share_a_class_and_classes_are_capped():
    assert plan_classes([1000, 950, 990, 100], 4) == [(100, 1), (1000, 3)]  # 950 >= 7/8 of 1000
    many = plan_classes([2**n for n in range(20)], 64)
    assert len(many) == MAX_CLASSES and sum(rows for _, rows in many) == 64
    assert many[-1][0] == 2**19  # the largest request always fits


def test_grid_rows_are_sized_per_setting_and_answer_as_alone(tiny):  # noqa: F811
    """One prompt, the full cache and three SnapStream budgets, 4 rows: four classes, each row as wide
    as its setting needs (not the full cache's), every answer the one-by-one answer."""
    prompt = tuple(torch.randint(0, 320, (90,), generator=torch.Generator().manual_seed(5)).tolist())
    budgets = (16, 32, 48)
    settings = [{"method": "full"}]
    settings += [
        {"method": "snapstream", "budget": b, "window": 4, "kernel": 3, "sinks": 2, "ring": 8}
        for b in budgets
    ]
    requests = [Request(prompt, cache, 12, tag=index) for index, cache in enumerate(settings)]
    batcher = ContinuousBatcher(tiny, 4)
    got = {}
    batcher.run(requests, lambda answer: got.__setitem__(answer.request.tag, answer))
    assert [part.capacity for part in batcher.slots.parts] == [*budgets, 90 + 12]
    assert [part.keys[0].shape for part in batcher.slots.parts] == [(1, 2, c, 16) for c in (*budgets, 102)]
    assert batcher.steps == 11  # one model call per step for the four classes
    for request in requests:
        assert got[request.tag].tokens == alone(tiny, request).tokens
