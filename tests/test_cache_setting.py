"""One typed cache setting, made by one constructor (``CacheSetting.of``, no memo: whoever reuses a setting
keeps it), and one cache per request: the first request of a prompt and setting is prefilled into its own
cache, which that setting's other requests of the prompt load their rows from."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from snapeval.cache import SnapevalCache
from snapeval.configs import setting as setting_module
from snapeval.configs.compose import compose_config
from snapeval.configs.setting import FULL, CacheSetting
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.errors import SnapevalError
from snapeval.run.runner import run
from tests.test_continuous import tiny  # noqa: F401 (a fixture)
from tests.test_grid import TASK

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

SETTINGS = (
    {"method": "full", "budget": 256},  # the full cache ignores a sweep's budget
    {"method": "snapstream", "budget": 40, "window": 4, "kernel": 3, "sinks": 2, "ring": 8},
    {"method": "rkv", "budget": 24, "window": 4, "kernel": 3},  # evicts while decoding
)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts of settings made (a declared method's: its declaration made from a node) and of caches built,
    by class (a grid's shared prefill is a cache of its own, ``CacheGrid``)."""
    counts: Counter = Counter()
    make = setting_module.method_params

    def made(*args, **kwargs):
        counts["settings"] += 1
        return make(*args, **kwargs)

    build = SnapevalCache.__init__

    def built(self, *args, **kwargs):
        counts[type(self).__name__] += 1
        build(self, *args, **kwargs)

    monkeypatch.setattr(setting_module, "method_params", made)
    monkeypatch.setattr(SnapevalCache, "__init__", built)
    return counts


def test_a_setting_is_its_stored_parameters_and_knows_the_full_cache():
    full = CacheSetting.of({"method": "full", "budget": 256, "ratio": None})
    assert full.is_full and full.stored == {"method": FULL} and full.label == "Full cache"
    snap = CacheSetting.of(SETTINGS[1])
    assert not snap.is_full and snap.stored["budget"] == 40 and snap.stored["pooling"] == "max"
    assert CacheSetting.of(snap) is snap and CacheSetting.of(snap.stored) == snap  # its stored form
    assert CacheSetting.of({"method": "speculative_prefill", "budget": 64, "draft": "self"}).draft is None
    with pytest.raises(SnapevalError) as error:
        CacheSetting.of({"method": "snapstream", "budget": 96})
    assert error.value.field == "cache.budget"


def test_a_grid_run_builds_one_cache_per_request(tmp_path, counted, tiny_llama_overrides, monkeypatch):
    """A grid of 5 points (the full cache once: it ignores the budgets) on 2 prompts: 10 requests, 10
    caches (each prompt prefilled once, through a grid of its 5 requests' caches), built from 5 setting
    objects: the plan's, one per point, carried by every request of the point."""
    from snapeval.decode.continuous import work

    settings_built_from = []
    build = work.build_cache
    monkeypatch.setattr(
        work, "build_cache", lambda setting: settings_built_from.append(setting) or build(setting)
    )
    config = compose_config(
        f"run.db={tmp_path / 'db.sqlite'}",
        "run.progress=false",
        *tiny_llama_overrides,
        *TASK,
        "grid={cache: [full, snapkv, snapstream], params: {budget: [192, 320]}}",
    )
    summaries = run(config)
    assert len(summaries) == 5 and all(summary.computed == 2 for summary in summaries)
    print("SETTINGS", counted["settings"])
    caches = {name: count for name, count in counted.items() if name != "settings"}
    assert caches == {"FullCache": 2, "SnapKVCache": 4, "SnapStreamCache": 4, "CacheGrid": 2}
    assert len(settings_built_from) == 10 and len({id(setting) for setting in settings_built_from}) == 5


def test_the_batcher_builds_one_cache_per_request(tiny, counted):  # noqa: F811
    """2 prompts x 3 settings x 2 draws: 12 requests, 12 caches (6 of them prefilled), from 3 settings
    made once by their caller."""
    generator = torch.Generator().manual_seed(3)
    prompts = [tuple(torch.randint(0, 320, (60,), generator=generator).tolist()) for _ in range(2)]
    settings = [CacheSetting.of(node) for node in SETTINGS]
    requests = [
        Request(prompt, setting, 8, tag=(p, s, draw))
        for p, prompt in enumerate(prompts)
        for s, setting in enumerate(settings)
        for draw in range(2)
    ]
    answers = {}
    ContinuousBatcher(tiny, 4).run(requests, lambda answer: answers.__setitem__(answer.request.tag, answer))
    assert len(answers) == 12
    assert counted == {"settings": 3, "FullCache": 4, "SnapStreamCache": 4, "RKVCache": 4, "CacheGrid": 2}
    assert all(not request.engine.layers for request in requests)  # every prefill released once loaded
