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
from snapeval.tasks import load_task, qwen_math_grader
from snapeval.tasks.aime_scorers import SCORERS

PROBES = json.loads((Path(__file__).parent / "data" / "aime_probes.json").read_text(encoding="utf-8"))[
    "probes"
]


def test_the_probe_set_covers_the_answer_formats_and_tells_the_scorers_apart() -> None:
    assert len(PROBES) >= 40
    assert all(probe["verdicts"].keys() == SCORERS.keys() for probe in PROBES)
    assert len({probe["case"] for probe in PROBES}) == len(PROBES)
    for a, b in [("qwen_math", "math_verify"), ("qwen_math", "lm_eval"), ("math_verify", "lm_eval")]:
        assert any(p["verdicts"][a] != p["verdicts"][b] for p in PROBES), (a, b)


@pytest.mark.parametrize("scorer", list(SCORERS))
@pytest.mark.parametrize("probe", PROBES, ids=[p["case"] for p in PROBES])
def test_every_scorer_gives_its_originals_verdict(scorer: str, probe: dict) -> None:
    """The original's verdict, or its opposite where the probe names the deviation that explains it."""
    differs = probe.get("differs", {}).get(scorer)
    assert differs is None or differs in qwen_math_grader.DEVIATIONS
    assert SCORERS[scorer](probe["output"], probe["gold"]) is (probe["verdicts"][scorer] != bool(differs))


def test_the_qwen_grader_agrees_with_qwen_on_all_probes_but_three() -> None:
    """The measured agreement the README states: 148 of 151 (LaTeX the parsers read otherwise)."""
    differing = sorted(p["case"] for p in PROBES if "qwen_math" in p.get("differs", {}))
    assert (len(PROBES), len(PROBES) - len(differing)) == (151, 148)
    assert differing == ["braced comma thousands", "phantom digit", "tie after"]
    assert not any(set(p.get("differs", {})) - {"qwen_math"} for p in PROBES)  # the others: all agree


@pytest.mark.parametrize(("output", "verdict"), [("\\boxed{7\\,3}", True), ("\\boxed{\\textbf{73}}", False)])
def test_the_qwen_grader_reads_spacing_and_formatting_as_sympys_parse_latex(
    output: str, verdict: bool
) -> None:
    """Qwen2.5-Math's first parser skips ``\\,`` (7\\,3 is 73) and reads ``\\textbf`` as a symbol's name."""
    assert qwen_math_grader.score(output, "73") is verdict
    assert qwen_math_grader.score(output.replace("7", "8", 1), "73") is False


class _Tokenizer:
    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return "\\boxed{24}"


@pytest.mark.parametrize(
    ("scorer", "stored"), [("qwen_math", list(qwen_math_grader.DEVIATIONS)), ("lm_eval", None)]
)
def test_the_qwen_graders_deviations_are_stored_with_every_row_it_scores(tmp_path, scorer, stored) -> None:
    """Under any preset or none (here none): each row the grader scores names its deviations."""
    import torch

    from snapeval.decode.continuous.work import Answer, Request
    from snapeval.run.records import sample_row

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"id": 60, "problem": "Find $2^{10}$ mod 1000.", "answer": "024"}) + "\n")
    config = compose_config("task=aime24", f"task.scorer={scorer}", f"task.metadata.data_path={data}")
    task = load_task(config["task"], seed=0)
    (prompt,) = task.prompts(None)
    answer = Answer(Request((1, 2), {"method": "full"}, 8), [3], "eos", 0.1, 0.2, 64, 0, None)
    row = sample_row(task, prompt, [answer], None, _Tokenizer(), torch.device("cpu"))
    assert (row["score"], row["extra"].get("deviations")) == (1.0, stored)


def test_the_qwen_graders_deviations_are_named_by_the_task_and_the_preset() -> None:
    plain = load_task(compose_config("task=aime24")["task"], seed=0)
    assert (
        plain.deviations == qwen_math_grader.DEVIATIONS == ("qwen_math_latex_parser", "qwen_math_plain_eval")
    )
    assert load_task(compose_config("task=aime24", "task.scorer=lm_eval")["task"], seed=0).deviations == ()
    preset = compose_config("+protocol=aime24_r1")
    assert set(qwen_math_grader.DEVIATIONS) <= set(preset["protocol"]["deviations"])
    assert load_task(preset["task"], seed=0).deviations == qwen_math_grader.DEVIATIONS


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

    slow = "\\boxed{2^6+9}"  # equal to 73 only through sympy, which takes longer than 0.1 ms
    assert qwen_math_grader.score(slow, "73") is True
    assert qwen_math_grader.score(slow, "73", timeout_s=1e-4) is False
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL  # the handler is put back
