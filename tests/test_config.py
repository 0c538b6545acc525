"""Composing a run's config: what a user's overrides mean before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from snapeval.configs.compose import compose_config
from snapeval.configs.root import declared_fields
from snapeval.paths import CONF_DIR
from snapeval.results import flatten, identity


def test_other_weights_are_named_after_them_not_after_the_default_entry(tmp_path: Path) -> None:
    """``model.pretrained=<folder>`` over the default ``smollm2-135m`` runs other weights: their rows must
    not be stored (and shown, and compared) under the embedded model's name and Hub id."""
    folder = tmp_path / "random-deepseek"
    folder.mkdir()
    model = compose_config(f"model.pretrained={folder}")["model"]
    assert (model["name"], model["hub_id"]) == ("random-deepseek", None)
    hub = compose_config("model.pretrained=Qwen/Qwen2.5-0.5B-Instruct")["model"]
    assert hub["name"] == "Qwen/Qwen2.5-0.5B-Instruct"
    named = compose_config(f"model.pretrained={folder}", "model.name=mine")["model"]
    assert named["name"] == "mine"
    default = compose_config()["model"]
    assert (default["name"], default["hub_id"]) == ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert compose_config("model=qwen3-8b")["model"]["name"] == "qwen3-8b"


def stored_and_hash(*overrides: str) -> tuple[dict, str]:
    return identity(compose_config(*overrides))


def test_what_is_stored_and_hashed_follows_the_declarations() -> None:
    """The run group never changes a result's identity (only the shard a worker ran is stored), nor do
    the model's hub_id and prompt_style; what the answers depend on does."""
    stored, digest = stored_and_hash()
    assert stored["run"] == {"shard": None} and "job" not in stored and "grid" not in stored
    assert "protocol" not in stored and "config_overrides" not in stored["model"]  # unset optional nodes
    same = ["run.limit=3", "run.batch_size=2", "run.compile=off", "run.db=x.sqlite", "run.shard=0/2"]
    same += ["run.progress=false", "run.lease_s=60", "model.prompt_style=llama3", "task.num_prompts=7"]
    for override in same:
        assert stored_and_hash(override)[1] == digest, override
    differ = ["task.max_new_tokens=16", "seed=1", "generation.top_p=0.5", "model.dtype=bfloat16"]
    differ += ["task.context_length=512", "cache=snapkv"]
    for override in differ:
        assert stored_and_hash(override)[1] != digest, override


def test_the_answer_length_has_one_home() -> None:
    """``max_new_tokens`` is a task setting, in every file of conf/ and in the composed config."""
    homes = set()
    for path in CONF_DIR.rglob("*.yaml"):
        content = yaml.safe_load(path.read_text())
        if not isinstance(content, dict):  # conf/gates: a list of gate definitions
            continue
        group = path.parent.name if path.parent != CONF_DIR else ""
        package_global = path.read_text().startswith("# @package _global_")
        prefix = "" if package_global or not group else f"{group}."
        homes |= {key for key in flatten(content, prefix) if key.split(".")[-1] == "max_new_tokens"}
    assert homes == {"task.max_new_tokens", "task.answer_pass.max_new_tokens"}, homes
    composed = flatten(compose_config("task=longbench_v2_cot"))
    assert [key for key in composed if key.endswith("max_new_tokens")] == [
        "task.max_new_tokens",
        "task.answer_pass.max_new_tokens",
    ]


def test_every_scalar_field_declares_what_it_takes() -> None:
    """Each int, float, str or bool field has a check (its range or choices), run on construction: a
    new field cannot slip in with a type and no word on what it takes."""
    scalars = ("int", "float", "str", "bool", "int | None", "str | None")
    unchecked = [
        path
        for path, item in declared_fields()
        if item.type in scalars and item.metadata.get("check") is None
    ]
    assert unchecked == []
    assert len([path for path, item in declared_fields() if item.type in scalars]) > 40


def test_a_config_built_in_code_is_checked_as_a_composed_one() -> None:
    """The runner checks the dict it is given (a grid point, a test's config) by the same declarations."""
    from snapeval.configs.check import check
    from snapeval.errors import SnapevalError

    cfg = compose_config()
    check(cfg)
    bad = [
        ({**cfg, "task": {**cfg["task"], "limt": 1}}, "task.limt: unknown key; task ruler_passkey has "),
        ({**cfg, "run": {**cfg["run"], "batch_size": 0}}, "run.batch_size: must be an integer >= 1, got 0"),
        ({**cfg, "model": {**cfg["model"], "dtype": "int4"}}, "model.dtype: must be one of auto, float32"),
        (
            {**cfg, "protocol": {"name": "aime24_r1", "task": "aime24", "deviations": []}},
            "protocol: aime24_r1 is a protocol of task aime24, not of task ruler_passkey",
        ),
    ]
    for config, expected in bad:
        with pytest.raises(SnapevalError) as info:
            check(config)
        assert str(info.value).startswith(expected), info.value


def test_a_task_built_from_a_partial_config_takes_its_schemas_defaults() -> None:
    """lm-eval and tests may build a task from a few keys: what they leave out is the schema's default,
    the one home of every default (no second copy in the task modules)."""
    from snapeval.tasks import load_task

    aime = load_task({"name": "aime24", "max_new_tokens": 8, "metadata": {"data_path": None}}, seed=0)
    assert (aime.config["scorer"], aime.metadata["answer_from"]) == ("qwen_math", "response")
    code = load_task({"name": "livecodebench", "max_new_tokens": 8}, seed=0)
    assert (code.prompt_style, code.metadata["release"]) == ("openai_chat", "release_v5")
    assert code.metadata["code_extraction"] == "official"
    composed = compose_config("task=livecodebench")["task"]
    assert load_task(composed, seed=0).metadata == code.metadata
