"""LongBench-v2 prompts, CoT passes, sampling settings and answer extraction equal THUDM/LongBench's
``pred.py`` on recorded calls (tests/data/longbench_pred_py.json, recorded by running pred.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snapeval.tasks import longbench_v2 as lb

from .conftest import composed_sweep

RECORDED = json.loads((Path(__file__).parent / "data" / "longbench_pred_py.json").read_text(encoding="utf-8"))

EXTRACTION_IDS = [case["response"][:30] for case in RECORDED["extraction"]]


@pytest.mark.parametrize("record", RECORDED["plain"], ids=[r["row"]["_id"] for r in RECORDED["plain"]])
def test_the_0shot_prompt_is_pred_pys(record: dict) -> None:
    (call,) = record["calls"]
    assert lb.build_prompt(record["row"]) == call["prompt"]
    (cfg,) = composed_sweep(None, "+protocol=longbench_v2_official")
    assert (cfg["generation"]["temperature"], cfg["task"]["max_new_tokens"]) == (
        call["temperature"],
        call["max_tokens"],
    )


@pytest.mark.parametrize("record", RECORDED["cot"], ids=[r["row"]["_id"] for r in RECORDED["cot"]])
def test_both_cot_passes_are_pred_pys(record: dict) -> None:
    reasoning_call, answer_call = record["calls"]
    assert lb.build_prompt(record["row"], cot=True) == reasoning_call["prompt"]
    assert lb.build_cot_answer_prompt(record["row"], record["reasoning"]) == answer_call["prompt"]
    (cfg,) = composed_sweep(None, "task=longbench_v2_cot", "+protocol=longbench_v2_official")
    assert cfg["generation"]["temperature"] == reasoning_call["temperature"] == answer_call["temperature"]
    assert cfg["task"]["max_new_tokens"] == reasoning_call["max_tokens"]
    assert cfg["task"]["answer_pass"]["max_new_tokens"] == answer_call["max_tokens"]


def test_a_placeholder_inside_the_document_is_filled_as_pred_py_fills_it() -> None:
    (record,) = [r for r in RECORDED["plain"] if "$Q$" in r["row"]["context"]]
    prompt = lb.build_prompt(record["row"])
    assert "$Q$" not in prompt and prompt == record["calls"][0]["prompt"]


@pytest.mark.parametrize(
    "case", RECORDED["extraction"], ids=[c["response"][:30] for c in RECORDED["extraction"]]
)
def test_answers_are_extracted_as_pred_py_extracts_them(case: dict) -> None:
    assert lb.extract_answer(case["response"]) == case["pred"]
