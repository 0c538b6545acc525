"""The runner end to end on the embedded model: answers, storage, resume, interruption."""

from __future__ import annotations

import pytest

from snapeval import runner
from snapeval.generation import generate
from snapeval.models import encode_chat
from snapeval.results import ResultsDB, load

from .conftest import compose_config


def test_chat_prompt_without_extra_special_tokens_answers_paris(smollm):
    ids = encode_chat(smollm.tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    assert ids.count(smollm.tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # system, user, assistant
    from snapeval.cache import FullCache

    result = generate(smollm.model, ids, FullCache(), 16, {smollm.tokenizer.eos_token_id})
    assert "Paris" in smollm.tokenizer.decode(result.tokens)


def config(tmp_path, *overrides):
    return compose_config(f"db.url={tmp_path / 'db.sqlite'}", "progress=false", *overrides)


def test_passkey_run_stores_every_sample_with_provenance(smollm, tmp_path):
    cfg = config(tmp_path, "task.limit=3", "task.context_length=512")
    summary = runner.run(cfg)
    assert summary.n == 3 and summary.computed == 3
    assert summary.accuracy == 1.0  # the embedded model retrieves short passkeys with the full cache
    frame = load(tmp_path / "db.sqlite")
    assert len(frame) == 3
    assert set(frame["method"]) == {"full"}
    assert (frame["prompt_tokens"].between(480, 512)).all()
    assert (frame["kv_bytes"] > 0).all() and (frame["generated_tokens"] > 0).all()
    assert frame["output"].str.contains(r"\d{7}").all()


def test_snapstream_with_budget_over_prompt_gives_the_full_cache_outputs(smollm, tmp_path):
    full = runner.run(config(tmp_path, "task.limit=2", "task.context_length=512"))
    snap = runner.run(config(tmp_path, "task.limit=2", "task.context_length=512", "cache=snapstream"))
    assert full.config_hash != snap.config_hash
    with ResultsDB(tmp_path / "db.sqlite") as db:
        outputs = [{r["sample_id"]: r["output"] for r in db.samples_for(s.config_hash)} for s in (full, snap)]
    assert outputs[0] == outputs[1]


def test_rerun_computes_only_missing_samples_and_survives_interruption(smollm, tmp_path, monkeypatch):
    overrides = ("task.context_length=512", "cache=snapstream", "cache.budget=256")
    calls = []
    real_generate = runner.generate_draws

    def interrupted_after_one(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(runner, "generate_draws", interrupted_after_one)
    with pytest.raises(KeyboardInterrupt):
        runner.run(config(tmp_path, "task.limit=3", *overrides))
    monkeypatch.setattr(runner, "generate_draws", real_generate)
    frame = load(tmp_path / "db.sqlite")
    assert len(frame) == 1 and frame["status"].iloc[0] == "interrupted"

    resumed = runner.run(config(tmp_path, "task.limit=3", *overrides))
    assert (resumed.n, resumed.computed) == (3, 2)
    extended = runner.run(config(tmp_path, "task.limit=4", *overrides))
    assert (extended.n, extended.computed) == (4, 1)
    assert load(tmp_path / "db.sqlite")["sample_id"].nunique() == 4


def test_several_sampled_answers_per_prompt_are_stored_as_draws(smollm, tmp_path):
    cfg = config(
        tmp_path,
        "task.limit=2",
        "task.context_length=256",
        "generation.num_samples=2",
        "generation.do_sample=true",
        "generation.temperature=0.7",
        "task.max_new_tokens=8",
    )
    summary = runner.run(cfg)
    frame = load(tmp_path / "db.sqlite")
    assert summary.n == 4 and sorted(frame["sample_id"])[0].endswith("#0")
    assert {extra["draw"] for extra in frame["extra"]} == {0, 1}
    assert {extra["decoded_together"] for extra in frame["extra"]} == {
        2
    }  # each problem's draws decoded together


def test_draws_decoded_together_equal_draws_decoded_one_by_one(smollm, tmp_path):
    draws = ("task.limit=1", "task.context_length=256", "task.max_new_tokens=10", "generation.num_samples=3")
    sampled = ("generation.do_sample=true", "generation.temperature=0.8")
    sampled += ("cache=snapstream", "cache.budget=128")
    together = runner.run(config(tmp_path / "a", *draws, *sampled))
    one_by_one = runner.run(config(tmp_path / "b", *draws, *sampled, "generation.draw_batch=1"))
    assert together.config_hash == one_by_one.config_hash  # draw_batch changes how, not what
    a, b = (load(path / "db.sqlite").sort_values("sample_id") for path in (tmp_path / "a", tmp_path / "b"))
    assert list(a["output"]) == list(b["output"])
    assert list(a["kv_bytes"]) == list(b["kv_bytes"]) == [128 * 30 * 3 * 64 * 2 * 4] * 3  # one answer's share


def test_prompts_decoded_as_one_batch_equal_prompts_decoded_one_by_one(smollm, tmp_path):
    setting = ("task.limit=3", "task.context_length=384", "task.max_new_tokens=12")
    setting += ("cache=snapstream", "cache.budget=128", "cache.window=8")
    batched = runner.run(config(tmp_path / "a", *setting, "generation.batch_size=3"))
    one_by_one = runner.run(config(tmp_path / "b", *setting))
    assert batched.config_hash == one_by_one.config_hash  # batch_size changes how, not what
    a, b = (load(path / "db.sqlite").sort_values("sample_id") for path in (tmp_path / "a", tmp_path / "b"))
    assert list(a["output"]) == list(b["output"])
    assert list(a["prompt_tokens"]) == list(b["prompt_tokens"])
    assert [extra["kept_histogram"] for extra in a["extra"]] == [
        extra["kept_histogram"] for extra in b["extra"]
    ]
    assert {extra["decoded_together"] for extra in a["extra"]} == {3}
    assert list(a["kv_bytes"]) == list(b["kv_bytes"]) == [128 * 30 * 3 * 64 * 2 * 4] * 3
