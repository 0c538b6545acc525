"""kvpress presses as a snapeval method: the same positions as kvpress's own forward hook, the same as
snapeval's SnapKV at matched settings, and end to end through the runner. Skipped without kvpress
(`pip install "snapeval[kvpress]"`; `.ci/run` runs them in a venv at the lowest supported transformers)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache

from snapeval.cache import build_cache
from snapeval.errors import SnapevalError
from snapeval.models import encode_chat

NOTES = " ".join(f"Note {n}: the code of box {n} is {1000 + 37 * n}." for n in range(60))
QUESTION = " Which code does box 17 have? Answer with the number."
KVPRESS = "needs kvpress (pip install 'snapeval[kvpress]')"


def test_a_missing_kvpress_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "kvpress", None)  # import kvpress now raises ImportError
    with pytest.raises(
        SnapevalError, match=r"cache.press: kvpress is not installed; pip install 'snapeval\[kvpress\]'"
    ):
        build_cache({"method": "kvpress", "compression_ratio": 0.5})


@pytest.fixture(scope="module")
def prompt(smollm):
    pytest.importorskip("kvpress", reason=KVPRESS)
    return encode_chat(smollm.tokenizer, [{"role": "user", "content": NOTES + QUESTION}])


def kept_by_kvpress_itself(model, prompt, press):
    """Per layer, per KV head, the prompt positions kvpress's own forward hook keeps in a DynamicCache
    (found by matching each kept key to the uncompressed prefill's keys)."""
    with torch.inference_mode():
        full = DynamicCache()
        model(input_ids=torch.tensor([prompt]), past_key_values=full)
        compressed = DynamicCache()
        with press(model):
            model(input_ids=torch.tensor([prompt]), past_key_values=compressed)
    kept = []
    for layer_full, layer_kept in zip(full.layers, compressed.layers, strict=True):
        distances = torch.cdist(layer_kept.keys[0].float(), layer_full.keys[0].float())  # (heads, kept, L)
        kept.append([sorted(row.tolist()) for row in distances.argmin(dim=-1)])
    return kept


def kept_by_snapeval(model, prompt, params):
    cache = build_cache(params)
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt]), past_key_values=cache)
    return [
        [sorted(row.tolist()) for row in cache.kept_positions(layer)[0]] for layer in range(len(cache.layers))
    ]


@pytest.mark.parametrize("name", ["SnapKVPress", "ExpectedAttentionPress"])
def test_each_press_keeps_what_kvpress_itself_keeps(smollm, prompt, name):
    import kvpress

    ours = kept_by_snapeval(
        smollm.model, prompt, {"method": "kvpress", "press": name, "compression_ratio": 0.6}
    )
    theirs = kept_by_kvpress_itself(smollm.model, prompt, getattr(kvpress, name)(compression_ratio=0.6))
    assert len(ours[0][0]) == int(len(prompt) * 0.4)
    assert ours == theirs


def test_knorm_keeps_equally_short_keys_ties_broken_by_column(smollm, prompt):
    """KnormPress scores a key by its norm, which RoPE does not change: a token repeated in the prompt ties
    with itself. torch.topk (kvpress) breaks ties as it likes, snapeval keeps the earlier column; the
    kept key norms are the same."""
    import kvpress

    ours = kept_by_snapeval(
        smollm.model, prompt, {"method": "kvpress", "press": "KnormPress", "compression_ratio": 0.6}
    )
    theirs = kept_by_kvpress_itself(smollm.model, prompt, kvpress.KnormPress(compression_ratio=0.6))
    with torch.inference_mode():
        full = DynamicCache()
        smollm.model(input_ids=torch.tensor([prompt]), past_key_values=full)
    for layer, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
        norms = full.layers[layer].keys[0].float().norm(dim=-1)  # (kv_heads, L)
        for head, (a, b) in enumerate(zip(mine, other, strict=True)):
            assert torch.allclose(norms[head, a].sort().values, norms[head, b].sort().values, atol=1e-5)
    assert ours != theirs  # the ties are real: the columns differ somewhere


def test_kvpress_snapkv_keeps_the_positions_of_snapeval_snapkv_at_matched_settings(smollm, prompt):
    """window 64, kernel 5, average pooling, GQA mean, no sinks, the same kept count."""
    kept = int(len(prompt) * 0.5)
    press = {"method": "kvpress", "press": "SnapKVPress", "compression_ratio": 0.5}
    press["press_args"] = '{"window_size": 64, "kernel_size": 5}'
    snapkv = {
        "method": "snapkv",
        "budget": kept,
        "window": 64,
        "kernel": 5,
        "pooling": "avg",
        "gqa_reduce": "mean",
    }
    assert kept_by_snapeval(smollm.model, prompt, press) == kept_by_snapeval(smollm.model, prompt, snapkv)


def test_the_memory_estimator_sizes_a_press_by_its_budget():
    pytest.importorskip("kvpress", reason=KVPRESS)
    from snapeval.memory import estimate

    assert (
        estimate("smollm2-135m", "sn40l", context=512, budget=256, method="kvpress").tokens_compressed == 256
    )


def test_bad_press_names_and_arguments_are_one_line():
    pytest.importorskip("kvpress", reason=KVPRESS)
    with pytest.raises(
        SnapevalError, match=r"cache.press: no kvpress scorer press 'NopePress'; choose one of"
    ):
        build_cache({"method": "kvpress", "press": "NopePress"})
    with pytest.raises(SnapevalError, match=r"cache.press_args: SnapKVPress does not take"):
        build_cache({"method": "kvpress", "press": "SnapKVPress", "press_args": '{"windw": 3}'})


def test_a_press_runs_through_the_runner_into_the_database(tmp_path):
    pytest.importorskip("kvpress", reason=KVPRESS)
    from snapeval.results import load

    database = tmp_path / "db.sqlite"
    overrides = ["cache=kvpress", "cache.press=ExpectedAttentionPress", "cache.compression_ratio=0.5"]
    overrides += ["task.context_length=512", "run.limit=2", f"run.db={database}", "run.progress=false"]
    done = subprocess.run(
        [sys.executable, "-m", "snapeval", *overrides],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    samples = load(database)
    assert len(samples) == 2 and set(samples["method"]) == {"kvpress"}
    assert (samples["kv_bytes"] > 0).all()
