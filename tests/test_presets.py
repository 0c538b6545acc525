"""The protocol presets compose to the official runs' settings, and name what they still do otherwise
(printed at the start of a run, stored with its config)."""

from __future__ import annotations

from typing import Any

import pytest

from snapeval.configs import protocols
from snapeval.errors import SnapevalError

from .conftest import composed_sweep

R1 = "model=deepseek-r1-distill-qwen-7b"  # a window that holds 32,768 new tokens

PRESETS = [
    ("livecodebench_official", "livecodebench", {"temperature": 0.2, "top_p": 0.95, "num_samples": 10}),
    ("longbench_v2_official", "longbench_v2", {"temperature": 0.1, "top_p": 1.0, "num_samples": 1}),
    ("aime24_r1", "aime24", {"temperature": 0.6, "top_p": 0.95, "num_samples": 64}),
]


@pytest.mark.parametrize(("preset", "task", "generation"), PRESETS)
def test_protocol_presets(preset: str, task: str, generation: dict[str, Any]) -> None:
    (cfg,) = composed_sweep(None, f"+protocol={preset}", R1)
    assert cfg["protocol"]["name"] == preset
    assert cfg["task"]["name"] == task
    assert cfg["generation"]["do_sample"] is True
    assert {key: cfg["generation"][key] for key in generation} == generation
    assert protocols.changed_settings(cfg) == []


def test_livecodebench_official_for_r1_is_its_style_stop_and_uncapped_sandbox() -> None:
    (cfg,) = composed_sweep(None, "task=livecodebench", "+protocol=livecodebench_official", R1)
    task = cfg["task"]
    assert task["prompt_style"] == cfg["model"]["prompt_style"] == "deepseek_r1"
    assert task["stop"] == ["###"]
    assert task["max_new_tokens"] == 2000
    assert task["metadata"] == {**task["metadata"], "code_extraction": "official", "release": "release_v5"}
    assert task["sandbox"]["address_space_bytes"] is None  # lcb_runner sets no RLIMIT_AS
    assert cfg["protocol"]["deviations"] == ["json_comparison", "memory_cgroup"]


def test_longbench_cot_official_is_pred_py_cot() -> None:
    """pred.py --cot: T=0.1, a 1,024-token reasoning pass, then a 128-token answer pass."""
    (cfg,) = composed_sweep(None, "task=longbench_v2_cot", "+protocol=longbench_v2_official")
    assert cfg["task"]["name"] == "longbench_v2_cot" and cfg["task"]["cot"] is True
    assert cfg["generation"]["do_sample"] is True
    assert (cfg["generation"]["temperature"], cfg["generation"]["top_p"]) == (0.1, 1.0)
    assert cfg["task"]["max_new_tokens"] == 1024
    assert cfg["task"]["answer_pass"]["max_new_tokens"] == 128
    assert cfg["task"]["max_prompt_tokens"] == 120_000
    assert cfg["task"]["metadata"]["answer_from"] == "response"
    (plain,) = composed_sweep(None, "+protocol=longbench_v2_official")
    assert (plain["task"]["name"], plain["task"]["max_new_tokens"]) == ("longbench_v2", 128)


def test_aime24_r1_scores_with_the_reference_over_the_whole_output() -> None:
    (cfg,) = composed_sweep(None, "+protocol=aime24_r1", R1)
    assert cfg["task"]["scorer"] == "qwen_math"
    assert cfg["task"]["metadata"]["answer_from"] == "response"
    assert cfg["task"]["max_new_tokens"] == 32768


def test_a_protocol_of_another_task_is_refused() -> None:
    with pytest.raises(SnapevalError, match=r"^protocol: aime24_r1 is a protocol of task aime24"):
        composed_sweep(None, "+protocol=aime24_r1", "task=livecodebench", R1)
    with pytest.raises(SnapevalError, match="longbench_v2 or longbench_v2_cot, not of task aime24"):
        composed_sweep(None, "+protocol=longbench_v2_official", "task=aime24")


def test_deviations_are_printed_at_the_start_and_stored(capsys: pytest.CaptureFixture[str]) -> None:
    (cfg,) = composed_sweep(None, "+protocol=aime24_r1", R1, "task.max_new_tokens=512", "task.scorer=lm_eval")
    assert protocols.deviations(cfg) == [
        "qwen_math_latex_parser",
        "qwen_math_plain_eval",
        "task.max_new_tokens=512 (preset: 32768)",
        "task.scorer='lm_eval' (preset: 'qwen_math')",
    ]
    protocols.announce(cfg)
    printed = capsys.readouterr().err
    assert printed.startswith("protocol aime24_r1: deviations from the official run: qwen_math_latex_parser;")
    assert "task.scorer='lm_eval' (preset: 'qwen_math')" in printed
    (official,) = composed_sweep(None, "+protocol=longbench_v2_official")
    protocols.announce(official)
    none = "protocol longbench_v2_official: deviations from the official run: none\n"
    assert capsys.readouterr().err == none
    protocols.announce(composed_sweep(None, "task=aime24")[0])  # no preset: nothing to say
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("stop", "sandbox"), [("###", {}), ([""], {}), (["###"], {"memory": 1})])
def test_bad_stop_strings_and_sandbox_fields_are_refused(stop: Any, sandbox: dict) -> None:
    from snapeval.tasks import load_task

    (cfg,) = composed_sweep(None, "+protocol=livecodebench_official")
    with pytest.raises(SnapevalError, match=r"^task\.(stop|sandbox): "):
        load_task({**cfg["task"], "stop": stop, "sandbox": sandbox}, seed=0)
