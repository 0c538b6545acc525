"""``job=memory`` and ``+exp=memory_sweep`` (``python -m snapeval`` run in-process): one stored estimate per
point, equal to the engine's bytes."""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path

import pytest
import torch

from snapeval.__main__ import check_before_hydra
from snapeval.__main__ import main as snapeval_main
from snapeval.cache import FullCache, SnapevalCache, SnapStreamCache
from snapeval.cli import report
from snapeval.errors import SnapevalError
from snapeval.memory import estimate, geometry_from_config
from snapeval.memory.point import run_memory_point
from snapeval.results import load_memory
from tests.conftest import TINY_VOCAB, compose_config

SWEEP_CONTEXTS = (8192, 32768, 131072)
SWEEP_BUDGETS = (1024, 4096, 32768)


def snapeval(monkeypatch, tmp_path: Path, *args: str) -> None:
    """``python -m snapeval <args>`` in-process, in ``tmp_path`` (where Hydra writes its output folders):
    the front door's checks, then its Hydra main; a bad input exits (SystemExit) as the command would."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["snapeval", *args])
    root = logging.getLogger()  # Hydra gives the root logger handlers on this test's captured streams
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    try:
        check_before_hydra(list(args))
    except SnapevalError as error:
        raise SystemExit(report(error)) from None
    snapeval_main()


def test_sweep_stores_one_row_per_point(tmp_path, monkeypatch, capsys):
    db = tmp_path / "memory.sqlite"
    snapeval(monkeypatch, tmp_path, "+exp=memory_sweep", f"run.db={db}")
    df = load_memory(db)
    points = sorted(zip(df["context"], df["budget"], strict=True))
    assert points == list(itertools.product(SWEEP_CONTEXTS, SWEEP_BUDGETS))
    stored = df[(df["context"] == 131072) & (df["budget"] == 32768)].iloc[0]
    expected = estimate("deepseek-r1", "sn40l", context=131072, tp=16, budget=32768).as_row()
    assert {key: stored[key] for key in expected} == expected
    assert capsys.readouterr().out.count("deepseek-r1 (MLA") == len(df)


def test_rerunning_a_point_replaces_its_row(tmp_path):
    config = compose_config("job=memory", f"run.db={tmp_path / 'memory.sqlite'}")
    first = run_memory_point(config)
    stored_at = load_memory(tmp_path / "memory.sqlite").loc[0, "estimated_at"]
    assert run_memory_point(config) == first
    df = load_memory(tmp_path / "memory.sqlite")
    assert len(df) == 1
    assert df.loc[0, "estimated_at"] > stored_at
    assert (df.loc[0, "model"], df.loc[0, "tokens_compressed"]) == ("smollm2-135m", 1024)


@pytest.mark.parametrize(
    "override,field,message",
    [
        ("memory.context=-5", "memory.context", "must be a positive integer"),
        ("memory.hardware=tpu", "memory.hardware", "unknown hardware 'tpu'"),
        ("memory.kv_dtype=fp4", "memory.kv_dtype", "unknown dtype 'fp4'"),
        ("memory.model=123", "memory.model", "expected a name"),
        ("memory.budget=null", "memory.budget", "required by method=snapstream"),
        ("+memory.contxt=5", "memory.contxt", "unknown key"),
    ],
)
def test_bad_memory_values_name_their_key(override, field, message, tmp_path):
    config = compose_config("job=memory", override, f"run.db={tmp_path / 'memory.sqlite'}")
    with pytest.raises(SnapevalError, match=message) as error:
        run_memory_point(config)
    assert error.value.field == field


def test_bad_memory_value_is_one_error_line_and_exit_2(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit:
        snapeval(
            monkeypatch, tmp_path, "job=memory", "memory.context=-5", f"run.db={tmp_path / 'memory.sqlite'}"
        )
    assert exit.value.code == 2
    assert capsys.readouterr().err == "error: memory.context: must be a positive integer, got -5\n"


@pytest.mark.parametrize(
    "cache,budget",
    [
        pytest.param(FullCache(), None, id="full"),
        pytest.param(SnapStreamCache(budget=128, window=8, kernel=3, sinks=2, ring=16), 128, id="snapstream"),
    ],
)
def test_estimated_kv_bytes_equal_the_engine_cache_after_prefill(tiny_llama, cache: SnapevalCache, budget):
    prompt_ids = torch.randint(3, TINY_VOCAB, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    assert len(prompt_ids) > 128  # more than the SnapStream budget: its prompt is compressed
    assert tiny_llama.dtype == torch.float32
    with torch.inference_mode():
        tiny_llama(input_ids=torch.tensor([prompt_ids]), past_key_values=cache)
    expected = estimate(
        geometry_from_config(tiny_llama.config),
        "sn40l",
        context=len(prompt_ids),
        method=cache.method,
        budget=budget,
        kv_dtype="fp32",
    )
    assert cache.kv_bytes() == expected.kv_bytes_per_sequence_compressed
