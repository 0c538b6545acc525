"""The AIME scorers give their originals' verdicts (tests/data/aime_probes.json, recorded by running
Qwen2.5-Math's grader, math-verify and lm-eval's aime24 unmodified), and the task scores with the
scorer its config names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snapeval.configs.compose import compose_config
from snapeval.errors import SnapevalError
from snapeval.tasks import aime24 as aime
from snapeval.tasks import load_task
from snapeval.tasks.aime_scorers import SCORERS

PROBES = json.loads((Path(__file__).parent / "data" / "aime_probes.json").read_text(encoding="utf-8"))[
    "probes"
]


def test_the_probe_set_covers_the_answer_formats_and_tells_the_scorers_apart() -> None:
    assert len(PROBES) >= 40
    assert all(probe["verdicts"].keys() == SCORERS.keys() for probe in PROBES)
    for a, b in [("qwen_math", "math_verify"), ("qwen_math", "lm_eval"), ("math_verify", "lm_eval")]:
        assert any(p["verdicts"][a] != p["verdicts"][b] for p in PROBES), (a, b)


@pytest.mark.parametrize("scorer", list(SCORERS))
@pytest.mark.parametrize("probe", PROBES, ids=[p["case"] for p in PROBES])
def test_every_scorer_gives_its_originals_verdict(scorer: str, probe: dict) -> None:
    assert SCORERS[scorer](probe["output"], probe["gold"]) is probe["verdicts"][scorer]


def test_the_reference_scorer_is_the_default() -> None:
    task = load_task(compose_config("task=aime24")["task"], seed=0)
    assert task.scorer == "qwen_math" == next(iter(SCORERS))
    row = {"answer": "73"}
    assert task.score_row(row, "The answer is $73$.") == {"acc": 1.0}  # unboxed, as truncated traces end
    assert task.score_row(row, "\\boxed{74}") == {"acc": 0.0}


@pytest.mark.parametrize(("scorer", "acc"), [("qwen_math", 1.0), ("math_verify", 1.0), ("lm_eval", 0.0)])
def test_the_configured_scorer_scores(scorer: str, acc: float) -> None:
    config = compose_config("task=aime24", f"task.scorer={scorer}")
    assert config["task"]["scorer"] == scorer  # part of the stored config, so of its hash
    task = load_task(config["task"], seed=0)
    assert task.score_row({"answer": "73"}, "So the answer is 73.") == {"acc": acc}


def test_an_unknown_scorer_is_refused() -> None:
    with pytest.raises(SnapevalError, match="task.scorer"):
        load_task(compose_config("task=aime24", "task.scorer=exact")["task"], seed=0)


def test_answer_from_after_reasoning_ignores_the_trace() -> None:
    output = "<think>so \\boxed{73}</think>\nThe answer is 12."
    assert aime.score(output, "73")["acc"] == 1  # every official scorer reads the whole output
    for scorer in SCORERS:
        assert aime.score(output, "73", scorer, "after_reasoning")["acc"] == 0


def test_the_qwen_grader_never_evaluates_model_written_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    output = f"The answer is __import__('pathlib').Path({str(marker)!r}).touch()"
    assert SCORERS["qwen_math"](output, "73") is False
    assert not marker.exists()


def test_a_qwen_comparison_out_of_time_is_wrong_as_in_its_process_pool() -> None:
    import signal

    from snapeval.tasks import qwen_math_grader

    slow = "\\boxed{2^6+9}"  # equal to 73 only through sympy, which takes longer than 0.1 ms
    assert qwen_math_grader.score(slow, "73") is True
    assert qwen_math_grader.score(slow, "73", timeout_s=1e-4) is False
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL  # the handler is put back
