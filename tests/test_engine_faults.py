"""A deployed engine's faults, each a one-line error or a stored note, nothing lost: the server is
:mod:`tests.fake_engine` started by ``engine.serve``, the client lm-eval's real ``local-completions``.

* 429 and 5xx: lm-eval's client tries each call ``max_retries`` times in all, with backoff; a server that
  recovers within them is never seen, one that does not ends the run in one line with the status, the
  server's reason, the attempts and what to change; the samples stored before are kept, and a re-run
  computes only the missing ones.
* 4xx: a prompt over the server's context (llama.cpp's 400, its message) ends the run in one line naming
  the cause; one call at a time (``requests``) the server's reason is quoted, several at once (``aiohttp``,
  whose error has no body) the status alone.
* A call past the client's ``timeout``; a model the server does not serve (vLLM's 404, and a note beforehand
  where the server lists its models); a server that cuts the prompt without saying so (its
  ``usage.prompt_tokens`` below what was sent): a note stored per sample, printed, counted by the report.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
import sys
from pathlib import Path

import pytest

from snapeval.couplings import at_least
from snapeval.errors import SnapevalError
from snapeval.run import runner

from .conftest import compose_config

FAKE = f"{sys.executable} -m tests.fake_engine --port {{port}}"
CONTEXT = (
    "This model's maximum context length is 2048 tokens, however you requested 2206 tokens (2201 in your "
    "prompt; 5 for the completion). Please reduce your prompt; or completion length."
)


def faulty(overrides: tuple[str, ...], db: Path, flags: str, arguments: str = "max_retries=1", *extra: str):
    """A run of 3 passkeys, one call at a time, against a fake engine started with ``flags``."""
    base_url = "base_url=http://127.0.0.1:{port}/v1/completions"
    return compose_config(
        *overrides,
        "model.backend=lm_eval:local-completions",
        f"model.backend_args={base_url},model=fake,{arguments}",
        f"engine.serve={FAKE} {flags}",
        "run.limit=3",
        "run.batch_size=1",
        "task.context_length=512",
        "run.progress=false",
        f"run.db={db}",
        *extra,
    )


def stored(db: Path) -> tuple[list[str], list[dict]]:
    """Each run's status, and each stored sample's ``extra``."""
    with sqlite3.connect(db) as connection:
        statuses = [status for (status,) in connection.execute("SELECT status FROM runs ORDER BY id")]
        extras = [json.loads(extra) for (extra,) in connection.execute("SELECT extra FROM samples")]
    return statuses, extras


def failure(cfg: dict) -> str:
    with pytest.raises(SnapevalError) as info:
        runner.run(cfg)
    return str(info.value)


def test_a_server_that_recovers_within_the_clients_retries_is_never_seen(tiny_llama_overrides, tmp_path):
    """Its first two completions answer 503: lm-eval's backoff (1 s, 1 s) tries a third time."""
    db = tmp_path / "recovers.db"
    cfg = faulty(tiny_llama_overrides, db, "--fail-status 503 --fail-until 2", "max_retries=3")
    [summary] = runner.run(cfg)
    assert (summary.n, summary.computed, summary.accuracy) == (3, 3, 1.0)
    assert stored(db)[0] == ["finished"]


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (
            429,
            "rate limit reached",
            "HTTP 429 rate limit reached, after 2 attempts (max_retries=2): the server limits its rate: "
            "raise max_retries, or lower num_concurrent, in model.backend_args",
        ),
        (503, "overloaded", "HTTP 503 overloaded, after 2 attempts (max_retries=2): the server failed; its"),
        (
            400,
            CONTEXT,
            f"HTTP 400 {CONTEXT}, after 2 attempts (max_retries=2): the prompt is over the server's context: "
            "serve a longer one, or lower task.context_length",
        ),
    ],
)
def test_a_status_past_the_retries_ends_the_run_in_one_line_keeping_what_was_stored(
    status, reason, expected, tiny_llama_overrides, tmp_path
):
    """The first completion is answered and stored, every later one fails: the run ends naming the status,
    the server's reason and the attempts; a re-run against a healthy server computes the 2 missing."""
    db = tmp_path / f"status{status}.db"
    flags = f"--fail-status {status} --fail-from 2 --reason {shlex.quote(reason)}"
    message = failure(faulty(tiny_llama_overrides, db, flags, "max_retries=2"))
    assert message.startswith(f"model.backend: the engine failed to answer: {expected}"), message
    assert "\n" not in message
    statuses, extras = stored(db)
    assert (statuses, len(extras)) == (["failed"], 1)
    [summary] = runner.run(faulty(tiny_llama_overrides, db, ""))
    assert (summary.n, summary.computed) == (3, 2)


def test_several_calls_at_once_name_the_status_without_the_servers_reason(tiny_llama_overrides, tmp_path):
    """``num_concurrent=2``: lm-eval's aiohttp path, whose error carries no body (lm-eval logs it)."""
    db = tmp_path / "concurrent.db"
    flags = f"--fail-status 400 --reason {shlex.quote(CONTEXT)}"
    cfg = faulty(tiny_llama_overrides, db, flags, "max_retries=1,num_concurrent=2", "run.batch_size=2")
    assert failure(cfg) == (
        "model.backend: the engine failed to answer: HTTP 400 Bad Request, after 1 attempt (max_retries=1): "
        "the server refuses the request (a model it does not serve? an argument it does not take?)"
    )


@pytest.mark.parametrize("concurrent", [1, 2])
def test_a_call_past_its_timeout_ends_the_run_in_one_line(concurrent, tiny_llama_overrides, tmp_path):
    """One call at a time (``requests``) and several (``aiohttp``): lm-eval 0.4.10 gives the first no
    timeout at all (it waits for the server), 0.4.13 gives both."""
    if concurrent == 1 and not at_least("0.4.13", "lm_eval"):
        pytest.skip("lm-eval before 0.4.13 sends one call at a time with no timeout")
    db = tmp_path / "slow.db"
    arguments = f"max_retries=1,timeout=1,num_concurrent={concurrent}"
    message = failure(faulty(tiny_llama_overrides, db, "--slow 4", arguments, f"run.batch_size={concurrent}"))
    assert message == (
        "model.backend: the engine failed to answer: no answer within its timeout 1 s, after 1 attempt "
        "(max_retries=1): raise timeout (seconds a call may take) in model.backend_args, or give the server "
        "less to do at once (num_concurrent)"
    )
    assert stored(db) == (["failed"], [])


def test_a_model_the_server_does_not_list_is_noted_and_its_404_ends_the_run(
    tiny_llama_overrides, tmp_path, capsys
):
    db = tmp_path / "model.db"
    cfg = faulty(tiny_llama_overrides, db, "--strict-model", "max_retries=1,model=smollm3")
    message = failure(cfg)
    assert message.startswith(
        "model.backend: the engine failed to answer: HTTP 404 The model `smollm3` does not exist., after 1 "
        "attempt (max_retries=1): the server refuses the request (a model it does not serve?"
    ), message
    note = (
        "note: model.backend_args: the server lists no model 'smollm3' (it lists 'fake'): a server that "
        "answers anyway (llama.cpp) answers with the model it serves; give model= as the server lists it"
    )
    assert note in capsys.readouterr().err.splitlines()
    with sqlite3.connect(db) as connection:
        [(engine,)] = connection.execute("SELECT engine FROM runs").fetchall()
    assert json.loads(engine)["note"] == note.removeprefix("note: model.backend_args: ")


def test_a_server_that_cuts_the_prompt_is_noted_per_sample_printed_and_counted(
    tiny_llama_overrides, tmp_path, capsys
):
    """It counts 100 prompt tokens of the ~500 sent: each sample is stored, scored, with its note."""
    db = tmp_path / "cut.db"
    [summary] = runner.run(faulty(tiny_llama_overrides, db, "--prompt-tokens 100"))
    assert (summary.n, summary.accuracy) == (3, 1.0)
    statuses, extras = stored(db)
    with sqlite3.connect(db) as connection:
        sent = [n for (n,) in connection.execute("SELECT prompt_tokens FROM samples")]
    assert statuses == ["finished"] and all(n > 400 for n in sent)
    assert [extra["server_prompt_tokens"] for extra in extras] == [100] * 3
    assert [extra["server_truncated"] for extra in extras] == [
        f"the server counted 100 of the {n} prompt tokens sent: it cut the prompt without saying so"
        for n in sent
    ]
    assert (
        "note: model.backend: the server cut 3 of 3 prompts without saying so (it counted fewer prompt "
        "tokens than were sent): stored as server_truncated" in capsys.readouterr().err.splitlines()
    )


def test_a_count_within_the_slack_of_what_was_sent_is_no_cut():
    """A server's tokenizer may read the prompt's text a few tokens apart from snapeval's: 1% of 500."""
    from snapeval.backends.lm_eval import EngineAnswer
    from snapeval.decode.continuous import Request

    def answer(sent: int, counted: int | None) -> EngineAnswer:
        request = Request(tuple(range(sent)), {"method": "full"}, 8)
        return EngineAnswer(request, [], "stop", 0.0, 0.0, None, 0, None, server_prompt_tokens=counted)

    assert [answer(500, counted).truncated for counted in (None, 500, 501, 495, 494, 100)] == [
        False,
        False,
        False,
        False,
        True,
        True,
    ]
