"""Accuracy gates judged on hand-made databases (--no-run: no model is loaded), and the shipped gate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from snapeval.cache import effective_params
from snapeval.commands.gate import Gate, judge, load_gates, main
from snapeval.results import ResultsDB, config_hash, database_url, stored_config
from snapeval.run import evaluation

SHIPPED_SPEC = Path(__file__).resolve().parent.parent / "conf" / "gates" / "ci.yaml"
TASK = ["task=ruler_passkey", "task.context_length=512", "run.limit=20"]
CACHE = ["cache=snapstream", "cache.budget=256"]


def gate_spec(name: str = "passkey", min_retained: float = 0.8, min_n: int = 20) -> dict:
    return {"name": name, "task": TASK, "cache": CACHE, "min_retained": min_retained, "min_n": min_n}


def write_spec(path: Path, *gates: dict) -> Path:
    path.write_text(yaml.safe_dump(list(gates)))
    return path


def store(db_url: str, config: dict, scores: list[float]) -> None:
    """Store ``scores`` as samples 0, 1, ... of ``config``, under the hash the runner would use."""
    stored = stored_config(config, effective_params(config["cache"]))
    digest = config_hash(stored)
    with ResultsDB(db_url) as db:
        run_id = db.start_run(stored, digest)
        for index, score in enumerate(scores):
            db.add_sample(run_id, digest, {"sample_id": f"passkey-{index}", "score": score})
        db.finish_run(run_id)


@pytest.fixture
def db(tmp_path) -> str:
    """Full cache right on 20 samples, SnapStream on 18 of them; 5 more full-cache samples, unpaired."""
    url = database_url(tmp_path / "gate.sqlite")
    full, compressed = Gate.from_spec(gate_spec(), "test").configs(url)
    store(url, full, [1.0] * 25)
    store(url, compressed, [1.0] * 18 + [0.0] * 2)
    return url


def test_a_gate_is_judged_on_paired_samples_only(db):
    """18 of the 20 paired samples kept: the lower bound solves p**20 + 20 p**19 (1 - p) + 190 p**18
    (1 - p)**2 = 0.05, p = 0.717; the 5 unpaired full-cache samples are not counted."""
    with ResultsDB(db) as results:
        verdict = judge(Gate.from_spec(gate_spec(min_retained=0.5), "test"), results)
    assert (verdict.n, verdict.full_accuracy, verdict.compressed_accuracy) == (20, 1.0, 0.9)
    assert verdict.bounds.ratio == pytest.approx(0.9)
    assert verdict.bounds.lower == pytest.approx(0.7174, abs=1e-4) and verdict.passed


@pytest.mark.parametrize(
    ("gate", "passed"),
    [
        (gate_spec(min_retained=0.0), True),
        (gate_spec(min_retained=1.5), False),  # upper bound 0.988 / 0.025**(1/20) = 1.188 < 1.5: fail
        (gate_spec(min_retained=0.0, min_n=21), False),  # not enough paired samples
        (gate_spec(min_retained=0.7), True),  # the lower bound 0.717 reaches it
        (gate_spec(min_retained=0.75), False),  # 0.9 retained, but open: not shown with 95% confidence
    ],
)
def test_gate_verdicts(gate, passed, db):
    with ResultsDB(db) as results:
        assert judge(Gate.from_spec(gate, "test"), results).passed is passed


def test_cli_exits_non_zero_on_any_failed_gate(db, tmp_path, capsys):
    loose = write_spec(tmp_path / "loose.yaml", gate_spec("loose", min_retained=0.0))
    both = write_spec(tmp_path / "both.yaml", gate_spec("loose", 0.0), gate_spec("impossible", 1.5))
    assert main(["--spec", str(loose), "--db", db, "--no-run"]) == 0
    assert "PASS loose: retained 0.900 of the full accuracy" in capsys.readouterr().out
    assert main(["--spec", str(both), "--db", db, "--no-run"]) == 1
    printed = capsys.readouterr().out
    assert "PASS loose" in printed and "FAIL impossible" in printed
    assert "95% bounds of the retention: [0.717, 1.188] (the lower one required >= 1.5): fail" in printed
    assert printed.rstrip().endswith("1 of 2 gates passed")


def test_ten_samples_cannot_show_095_retention(tmp_path, capsys):
    """10 of 10 kept: the lower bound is 0.05**(1/10) = 0.741, and a record without a loss needs 59
    (0.95**59 = 0.0485 <= 0.05): the gate fails and says why, whatever the samples."""
    url = database_url(tmp_path / "ten.sqlite")
    spec = gate_spec("ten", min_retained=0.95, min_n=10)
    full, compressed = Gate.from_spec(spec, "test").configs(url)
    store(url, full, [1.0] * 10)
    store(url, compressed, [1.0] * 10)
    assert main(["--spec", str(write_spec(tmp_path / "ten.yaml", spec)), "--db", url, "--no-run"]) == 1
    printed = capsys.readouterr().out
    assert "FAIL ten: retained 1.000 of the full accuracy (required 0.95)" in printed
    assert "95% bounds of the retention: [0.741, 1.446] (the lower one required >= 0.95): too few" in printed
    assert (
        "    undecided: n = 10 cannot show 0.95 retention (needs >= 59 samples the full cache gets right, "
        "with no loss; has 10)\n" in printed
    )


def test_cli_fails_a_gate_without_stored_samples(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", gate_spec())
    ResultsDB(tmp_path / "empty.sqlite").close()
    assert main(["--spec", str(spec), "--db", str(tmp_path / "empty.sqlite"), "--no-run"]) == 1
    assert "FAIL passkey: no sample is stored for both" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"gates": []}, "must be a non-empty list of gates"),
        ("- name: [unclosed", "not valid YAML: while parsing a flow sequence"),
        ([{**gate_spec(), "extra": 1}], "[0]: must be a mapping with exactly the keys"),
        ([gate_spec(min_retained=-0.1)], "[0].min_retained: must be a number >= 0"),
        ([gate_spec(min_n=0)], "[0].min_n: must be a positive integer"),
        ([{**gate_spec(), "cache": "cache=snapkv"}], "[0].cache: must be a list of Hydra overrides"),
        ([{**gate_spec(), "task": ["task=nonexistent"]}], "cannot compose task=nonexistent"),
    ],
)
def test_cli_rejects_a_bad_spec_in_one_line(spec, message, tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec))
    ResultsDB(tmp_path / "db.sqlite").close()
    assert main(["--spec", str(path), "--db", str(tmp_path / "db.sqlite"), "--no-run"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1


@pytest.mark.parametrize("case", ["bad spec", "no database"])
def test_the_command_refuses_in_one_line_before_torch_can_load(case, tmp_path, torch_refused):
    spec = write_spec(tmp_path / "spec.yaml", gate_spec(min_n=0) if case == "bad spec" else gate_spec())
    args = ["--spec", str(spec), "--db", str(tmp_path / "missing.sqlite"), "--no-run"]
    result = subprocess.run(
        [sys.executable, "-m", "snapeval.commands.gate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=torch_refused,
    )
    expected = {
        "bad spec": f"error: {spec}[0].min_n: must be a positive integer, got 0\n",
        "no database": f"error: --db: no results database at {args[3]}; run python -m snapeval first\n",
    }
    assert (result.returncode, result.stderr) == (2, expected[case])


def test_shipped_spec_composes():
    for gate in load_gates(SHIPPED_SPEC):
        full, compressed = gate.configs("sqlite://")
        assert full["cache"]["method"] == "full" and compressed["cache"]["method"] != "full"
        assert full["task"] == compressed["task"]


@pytest.mark.slow
def test_shipped_gate_passes_on_the_embedded_model(tmp_path):
    assert main(["--spec", str(SHIPPED_SPEC), "--db", str(tmp_path / "gate.sqlite")]) == 0


def test_a_gate_loads_its_model_once_for_both_sides(tmp_path, tiny_llama_overrides, monkeypatch, capsys):
    """The full cache's side and the compressed one run on one model: it loads once. The gate says how
    many samples it runs, and each side shows its progress bar, as a run does."""
    loads = []
    real_load = evaluation.load_model
    monkeypatch.setattr(evaluation, "load_model", lambda spec: loads.append(spec) or real_load(spec))
    task = ["task=ruler_passkey", "task.context_length=256", "task.max_new_tokens=2", "run.limit=2"]
    spec = {
        "name": "tiny",
        "task": [*task, *tiny_llama_overrides],
        "cache": ["cache=snapstream", "cache.budget=128"],
        "min_retained": 0.5,
        "min_n": 2,
    }
    database = tmp_path / "gate.sqlite"
    main(["--spec", str(write_spec(tmp_path / "tiny.yaml", spec)), "--db", str(database)])
    with ResultsDB(database) as db:
        assert sorted(run["method"] for run in db.run_states()) == ["full", "snapstream"]
    assert len(loads) == 1
    out, err = capsys.readouterr()
    assert out.startswith(
        "tiny: 2 samples of ruler_passkey, each with the full cache and with cache=snapstream "
        "cache.budget=128 (those stored already are not run again)\n"
    )
    for side in ("full", "snapstream"):
        assert f"ruler_passkey [{side}]: 100%" in err and "2/2" in err
