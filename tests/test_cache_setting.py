"""One typed cache setting, made once: the plan makes each setting's declaration once per process, and
the batcher builds one engine per request (plus one cache per prompt and setting it prefills)."""

from __future__ import annotations

import pytest
import torch

from snapeval.configs import setting as setting_module
from snapeval.configs.compose import compose_config
from snapeval.configs.setting import FULL, CacheSetting
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.continuous import prefills as prefills_module
from snapeval.decode.continuous import work as work_module
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
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of declarations made and engines built, in a process that has made no setting yet."""
    counts = {"method_params": 0, "request engines": 0, "prefill caches": 0}
    monkeypatch.setattr(setting_module, "_MADE", {})

    def counting(name: str, function):
        def counted_call(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return counted_call

    monkeypatch.setattr(
        setting_module, "method_params", counting("method_params", setting_module.method_params)
    )
    monkeypatch.setattr(work_module, "build_cache", counting("request engines", work_module.build_cache))
    monkeypatch.setattr(
        prefills_module, "build_cache", counting("prefill caches", prefills_module.build_cache)
    )
    return counts


def test_a_setting_is_its_stored_parameters_and_knows_the_full_cache():
    full = CacheSetting.of({"method": "full", "budget": 256, "ratio": None})
    assert full.is_full and full.stored == {"method": FULL} and full.label == "Full cache"
    snap = CacheSetting.of(SETTINGS[1])
    assert not snap.is_full and snap.stored["budget"] == 40 and snap.stored["pooling"] == "max"
    assert CacheSetting.of(snap.stored) is snap  # its stored form finds the same setting
    assert CacheSetting.of({"method": "speculative_prefill", "budget": 64, "draft": "self"}).draft is None
    with pytest.raises(SnapevalError) as error:
        CacheSetting.of({"method": "snapstream", "budget": 96})
    assert error.value.field == "cache.budget"


def test_a_grid_run_makes_each_setting_once(tmp_path, counted, tiny_llama_overrides):
    """A grid of 5 points (the full cache once: it ignores the budgets) on 2 prompts, from the config
    check through the stored identities, the requests and the batcher: each declaration is made once,
    each request builds one engine, and one prefill per prompt fills a cache per setting."""
    config = compose_config(
        f"run.db={tmp_path / 'db.sqlite'}",
        "run.progress=false",
        *tiny_llama_overrides,
        *TASK,
        "grid={cache: [full, snapkv, snapstream], params: {budget: [192, 320]}}",
    )
    summaries = run(config)
    assert len(summaries) == 5 and all(summary.computed == 2 for summary in summaries)
    assert counted == {"method_params": 5, "request engines": 10, "prefill caches": 10}


def test_the_batcher_builds_one_engine_per_request(tiny, counted):  # noqa: F811
    """2 prompts x 3 settings x 2 draws: 12 requests, 12 engines, 6 prefilled caches, 3 declarations."""
    generator = torch.Generator().manual_seed(3)
    prompts = [tuple(torch.randint(0, 320, (60,), generator=generator).tolist()) for _ in range(2)]
    requests = [
        Request(prompt, cache, 8, tag=(p, s, draw))
        for p, prompt in enumerate(prompts)
        for s, cache in enumerate(SETTINGS)
        for draw in range(2)
    ]
    answers = {}
    ContinuousBatcher(tiny, 4).run(requests, lambda answer: answers.__setitem__(answer.request.tag, answer))
    assert len(answers) == 12
    assert counted == {"method_params": 3, "request engines": 12, "prefill caches": 6}
