"""Several turns on one compressed context, as a chat engine with prefix reuse serves them.

A request's context is prefilled (and compressed) once; each later turn's ids (the end of the previous
answer's turn, the next user message, the assistant header) are fed to the cache as it stands and the next
answer decoded. On a 2-layer random-weight Llama:

* the full cache over 3 turns answers as greedy decoding of each turn with the whole conversation so far
  as one prompt, recomputed without any cache (an answer that ends on the end of turn that the follow-up
  starts with is fed it once);
* the batcher answers every turn as the one-by-one path does, for full, SnapKV, SnapStream and
  StreamingLLM at budgets that compress, greedy and sampled, with one-turn requests in the same rows
  answered as alone;
* a compressed cache whose budget holds the whole conversation answers as the full cache, one prefill
  shared (a grid);
* the follow-up ids are what SmolLM2's chat template writes between an answer and the next question;
* the runner stores each turn of a grid's samples, the same rows after an interruption and resume, and
  refuses a deployed engine in one line before any call.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
import torch

from snapeval.cache import build_cache
from snapeval.cache.grid import CacheGrid
from snapeval.decode.continuous import ContinuousBatcher, Request, prefills
from snapeval.decode.generation import generate, prompt_logits
from snapeval.decode.sampling import Sampling
from snapeval.errors import SnapevalError
from snapeval.models import encode_chat, load_tokenizer
from snapeval.results import ResultsDB
from snapeval.run import runner
from snapeval.run.evaluation import Evaluation
from snapeval.run.requests import RequestBuilder
from snapeval.tasks import Task

from .conftest import SMOLLM2, TINY_VOCAB, compose_config
from .test_continuous import TOLERANCE, alone
from .test_graphs_step import run as run_steps

MAX_NEW = 6
COMPRESSING = [
    {"method": "full"},
    {"method": "snapkv", "budget": 48, "window": 4, "kernel": 3},
    {"method": "snapstream", "budget": 48, "window": 4, "kernel": 3, "sinks": 2, "ring": 16},
    {"method": "streaming_llm", "budget": 40, "sinks": 2},
]
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def random_ids(generator: torch.Generator, count: int) -> tuple[int, ...]:
    return tuple(torch.randint(0, TINY_VOCAB, (count,), generator=generator).tolist())


def turns_of(answer) -> list[tuple[int, ...]]:
    return [turn.tokens for turn in answer.turns]


def batched(model, requests: list[Request], rows: int) -> dict[Any, Any]:
    got = {}
    ContinuousBatcher(model, rows).run(requests, lambda answer: got.__setitem__(answer.request.tag, answer))
    return got


def without_cache(
    model, prompt, followups, max_new: int, stops: set[int]
) -> tuple[list[tuple[int, ...]], list[int]]:
    """Greedy answers of every turn, each token from a forward over the whole conversation so far (no
    cache): an answer's tokens, then (where its end of turn is not the follow-up's first id) the token it
    ended on, then the follow-up; and every token a cache is fed by the end (the last one drawn is not)."""
    conversation, answers = list(prompt), []
    for turn in range(len(followups) + 1):
        answer: list[int] = []
        while True:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([conversation + answer])).logits[0, -1]
            token = int(logits.argmax())
            if token in stops:
                answer_and_end = [*answer, token]
                break
            answer.append(token)
            if len(answer) == max_new:
                answer_and_end = answer
                break
        answers.append(tuple(answer))
        if turn < len(followups):
            followup = list(followups[turn])
            same = answer_and_end and answer_and_end[-1] == followup[0]
            conversation += answer_and_end + (followup[1:] if same else followup)
    return answers, conversation + answer_and_end[:-1]


def test_the_full_cache_over_three_turns_answers_as_the_whole_conversation_without_cache(tiny_llama):
    generator = torch.Generator().manual_seed(11)
    prompt = random_ids(generator, 120)
    followups = [random_ids(generator, 7), random_ids(generator, 5)]
    probe, _ = without_cache(tiny_llama, prompt, followups, MAX_NEW, set())
    end = probe[0][3]  # a token the first answer draws: made the end of turn
    followups[0] = (end, *followups[0])  # the first follow-up starts with it, as a template's turn end
    stops = {end}
    expected, fed = without_cache(tiny_llama, prompt, followups, MAX_NEW, stops)
    request = Request(prompt, {"method": "full"}, MAX_NEW, Sampling(), frozenset(stops), followups=followups)
    cache, whole = build_cache({"method": "full"}), build_cache({"method": "full"})
    one_by_one = generate(tiny_llama, prompt, cache, MAX_NEW, stops, followups=followups)
    with torch.no_grad():
        prompt_logits(tiny_llama, fed, whole)
    assert cache.layers[0].seen == len(fed)  # the cache holds the conversation, each token once
    for ours, theirs in zip(cache.layers, whole.layers, strict=True):
        assert (ours.keys - theirs.keys).abs().max() < TOLERANCE
    one_turn = Request(prompt, {"method": "full"}, 1, tag="one turn")
    got = batched(tiny_llama, [request, one_turn], rows=2)
    rows, slot_bytes = got[None], got["one turn"].kv_bytes // len(prompt)
    assert [turn.tokens for turn in one_by_one.turns] == expected
    assert turns_of(rows) == expected and rows.kv_bytes == slot_bytes * len(fed)
    assert rows.turns[0].stopped == "eos" and len(set(expected)) == 3
    assert rows.tokens == list(expected[-1]) and rows.stopped == rows.turns[-1].stopped
    assert rows.decode_s == pytest.approx(sum(turn.decode_s for turn in rows.turns))


def mixed_requests(model) -> list[Request]:
    """Full, SnapKV, SnapStream and StreamingLLM at budgets that compress: per method a 3-turn request
    (greedy or sampled; SnapKV's with a query appended after compression; its second follow-up starting
    with the token that ends its answers) and a one-turn request."""
    generator = torch.Generator().manual_seed(3)
    requests = []
    for index, cache in enumerate(COMPRESSING):
        prompt = random_ids(generator, 110 + 10 * index)
        sampled = Sampling(do_sample=index % 2 == 1, temperature=0.9, top_p=0.95, seed=index)
        end = alone(model, Request(prompt, cache, MAX_NEW, sampled)).tokens[3]  # drawn: ends a turn
        followups = (random_ids(generator, 6), (end, *random_ids(generator, 4)))
        stops, compress_at = frozenset({end}), 100 if index == 1 else None
        several = Request(prompt, cache, MAX_NEW, sampled, stops, compress_at, tag=f"turns {index}")
        requests += [
            replace(several, followups=followups),
            Request(random_ids(generator, 90), cache, 9, Sampling(), stops, tag=f"one {index}"),
        ]
    return requests


def test_rows_of_several_turns_answer_as_one_by_one_beside_one_turn_rows(tiny_llama):
    """:func:`mixed_requests` in 3 rows: each 3-turn request answers every turn as the one-by-one path, and
    each one-turn request as alone."""
    requests = mixed_requests(tiny_llama)
    got = batched(tiny_llama, requests, rows=3)
    for request in requests:
        reference = alone(tiny_llama, request)
        assert turns_of(got[request.tag]) == [turn.tokens for turn in reference.turns], request.tag
        assert [t.stopped for t in got[request.tag].turns] == [t.stopped for t in reference.turns]
    several = [got[request.tag] for request in requests if request.followups]
    assert all(len(answer.turns) == 3 for answer in several)
    assert any(turn.stopped == "eos" for answer in several for turn in answer.turns)
    assert all(len(got[r.tag].turns) == 1 for r in requests if not r.followups)
    assert len({answer.turns[1].tokens for answer in several}) == len(several)  # the rows do differ


def test_a_budget_holding_the_whole_conversation_answers_as_the_full_cache(tiny_llama, monkeypatch):
    calls = []
    real = prefills.prefill_logits
    monkeypatch.setattr(prefills, "prefill_logits", lambda *a: calls.append(a[2]) or real(*a))
    generator = torch.Generator().manual_seed(5)
    prompt, followups = random_ids(generator, 100), (random_ids(generator, 8), random_ids(generator, 6))
    holding = [
        {"method": "full"},
        {"method": "snapkv", "budget": 200, "window": 4, "kernel": 3},
        {"method": "snapstream", "budget": 200, "window": 4, "kernel": 3, "sinks": 2, "ring": 96},
        {"method": "streaming_llm", "budget": 200, "sinks": 2},
    ]
    requests = [
        Request(
            prompt, cache, 10, Sampling(do_sample=sampled, seed=9), tag=(index, sampled), followups=followups
        )
        for index, cache in enumerate(holding)
        for sampled in (False, True)
    ]
    got = batched(tiny_llama, requests, rows=8)
    assert len(calls) == 1 and isinstance(calls[0], CacheGrid)  # one prefill for every setting
    for sampled in (False, True):
        full = turns_of(got[(0, sampled)])
        assert all(turns_of(got[(index, sampled)]) == full for index in range(1, len(holding)))
        assert [len(tokens) for tokens in full] == [10, 10, 10]
    assert all(answer.ring_wraps == 0 for answer in got.values())  # every row holds the conversation
    assert turns_of(got[(0, False)]) != turns_of(got[(0, True)])


def test_follow_up_ids_are_what_the_chat_template_writes_between_turns():
    tokenizer = load_tokenizer(SMOLLM2)
    builder = RequestBuilder(tokenizer, 4096, frozenset({tokenizer.eos_token_id}))
    messages = [{"role": "user", "content": "The pass key is 71432. Remember it. What is the pass key?"}]
    questions = ("Say it again.", "And the last digit?")
    request = builder.request(messages, 16, {"method": "full"}, Sampling(), followups=questions)
    answers = ["The pass key is 71432.", "71432"]
    conversation = list(request.prompt_ids)
    for answer, fed in zip(answers, request.followups, strict=True):
        conversation += tokenizer(answer, add_special_tokens=False)["input_ids"] + list(fed)
    rendered = [*messages]
    for answer, question in zip(answers, questions, strict=True):
        rendered += [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]
    assert conversation == encode_chat(tokenizer, rendered)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")  # not the eos at the transformers floor
    assert request.followups[0][0] == end_of_turn  # an answer's end, fed once
    assert tokenizer.decode(request.followups[1]).endswith(
        "And the last digit?<|im_end|>\n<|im_start|>assistant\n"
    )
    window = builder.request(messages, 16, {"method": "full"}, Sampling())
    assert request.prompt_ids == window.prompt_ids and window.followups == ()
    fed = sum(map(len, request.followups))
    assert request.new_tokens == 3 * 16 + fed and window.new_tokens == 16


def test_a_base_model_is_fed_each_question_between_blank_lines():
    class Plain:  # a tokenizer without a chat template: characters as ids
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [ord(ch) for ch in text]}

    builder = RequestBuilder(Plain(), 1000, frozenset())
    request = builder.request("Some context.", 4, {"method": "full"}, Sampling(), followups=("Why?",))
    assert "".join(map(chr, request.followups[0])) == "\n\nWhy?\n\n"


# --- the runner --------------------------------------------------------------------------------------

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


class ThreeQuestions(Task):
    """A pass key in ~150 tokens of filler, asked for three times: a multi-turn task of the tests."""

    names = ("ruler_passkey",)
    metrics = ("score",)
    id_field = "id"

    def rows(self, tokenizer) -> list[dict[str, Any]]:
        return [{"id": f"key{k}", "key": str(31000 + 977 * k)} for k in range(self.limit or 3)]

    def user_text(self, row: Mapping[str, Any]) -> str:
        return f"{FILLER * 4}The pass key is {row['key']}. {FILLER * 3}What is the pass key?"

    def target(self, row: Mapping[str, Any]) -> str:
        return row["key"]

    def score_row(self, row: Mapping[str, Any], output: str) -> dict[str, float]:
        return {"score": float(any(character.isdigit() for character in output))}

    def score_turn(self, row: Mapping[str, Any], turn: int, output: str) -> dict[str, float]:
        return {"score": float(len(output) % (turn + 2) == 0)}

    def followups(self, row: Mapping[str, Any]) -> tuple[str, ...]:
        return ("Say the pass key again.", "And once more, please?")


@pytest.fixture
def three_questions(monkeypatch):
    monkeypatch.setattr(
        "snapeval.tasks.load_task", lambda cfg, seed, limit=None: ThreeQuestions(cfg, seed, limit)
    )


GRID = "grid={cache: [full, snapstream], params: {budget: [96], ring: 16, window: 8}}"


def compose(tiny_llama_overrides, tmp_path, *overrides):
    db = f"run.db={tmp_path / 'db.sqlite'}"
    task = ("run.limit=3", "task.max_new_tokens=5")
    return compose_config(db, "run.progress=false", *tiny_llama_overrides, *task, GRID, *overrides)


def stored(path) -> dict[tuple[str, str], dict]:
    with ResultsDB(path) as db:
        hashes = [run["config_hash"] for run in db.runs_since(datetime(2000, 1, 1))]
        return {(digest, row["sample_id"]): row for digest in hashes for row in db.samples_for(digest)}


def kept(row: dict) -> tuple:
    """What a stored row holds that its seconds do not change."""
    turns = [(t["output"], t["generated_tokens"], t["stopped"]) for t in row["extra"]["turns"]]
    return row["output"], row["score"], row["metrics"], row["generated_tokens"], row["kv_bytes"], turns


def test_a_grid_stores_every_turn_and_an_interrupted_run_resumes_to_the_same_rows(
    three_questions, tiny_llama_overrides, tmp_path
):
    whole = tmp_path / "whole"
    runner.run(compose(tiny_llama_overrides, whole))
    rows = stored(whole / "db.sqlite")
    assert len(rows) == 6
    for row in rows.values():
        turns = row["extra"]["turns"]
        assert len(turns) == 3 and row["output"] == turns[-1]["output"]
        assert row["generated_tokens"] == sum(turn["generated_tokens"] for turn in turns) == 15
        per_turn = [float(len(turn["output"]) % (k + 2) == 0) for k, turn in enumerate(turns)]
        assert [row["metrics"][f"turn_{k + 1}"] for k in range(3)] == per_turn
        assert row["score"] == pytest.approx(sum(per_turn) / 3)
        assert row["decode_s"] == pytest.approx(sum(turn["decode_s"] for turn in turns))
    compressed = [row for row in rows.values() if "fidelity" in row["extra"]]
    assert len(compressed) == 3 and len({kept(row)[0] for row in rows.values()}) > 1

    resumed, commits = tmp_path / "resumed", []
    real_commit = Evaluation.commit

    def interrupted_after_two(self, point, row):
        if len(commits) == 2:
            raise KeyboardInterrupt
        commits.append(row["sample_id"])
        return real_commit(self, point, row)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Evaluation, "commit", interrupted_after_two)
        with pytest.raises(KeyboardInterrupt):
            runner.run(compose(tiny_llama_overrides, resumed))
    assert len(stored(resumed / "db.sqlite")) == 2
    again = runner.run(compose(tiny_llama_overrides, resumed))
    assert sum(summary.computed for summary in again) == 4
    ours = stored(resumed / "db.sqlite")
    assert ours.keys() == rows.keys()
    assert {key: kept(row) for key, row in ours.items()} == {key: kept(row) for key, row in rows.items()}


def test_a_deployed_engine_is_refused_a_task_of_several_turns_before_any_call(
    three_questions, tiny_llama_overrides, tmp_path
):
    base_url = "base_url=http://127.0.0.1:{port}/v1/completions"
    cfg = compose(
        tiny_llama_overrides,
        tmp_path,
        "model.backend=lm_eval:local-completions",
        f"model.backend_args={base_url},model=fake",
        f"engine.serve={sys.executable} -m tests.fake_engine --port {{port}}",
    )
    with pytest.raises(SnapevalError) as refused:
        runner.run(cfg)
    assert str(refused.value).startswith("model.backend: task ruler_passkey asks 3 questions of each context")
    with sqlite3.connect(tmp_path / "db.sqlite") as connection:
        assert connection.execute("SELECT count(*) FROM samples").fetchone() == (0,)
        assert connection.execute("SELECT count(*) FROM runs WHERE engine IS NOT NULL").fetchone() == (0,)


def test_captured_steps_feed_the_follow_ups_as_the_eager_step(tiny_llama, monkeypatch):
    """``run.compile=graphs`` (the capture traced on CPU, as tests/test_graphs_step.py does): a follow-up's
    tokens and counters written between steps are read by the one captured step's replays."""
    requests = mixed_requests(tiny_llama)
    eager, _, _ = run_steps(tiny_llama, requests, 3, False, monkeypatch)
    graphs, graphed, _ = run_steps(tiny_llama, requests, 3, True, monkeypatch)
    assert graphs == eager and graphed.captures == 1
