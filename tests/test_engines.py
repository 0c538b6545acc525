"""Deployed engines as backends (``model.backend=lm_eval:<model>``): lm-eval's client answers the runner's
requests, and the run is stored as any other.

* With an lm-eval model registered here (it answers the passkey it reads in the prompt, or nothing), a run
  stores one scored sample per prompt under a config that names its backend, sends the prompt snapeval
  would have decoded itself (its prompt ids as text) with the task's token limit, greedy, and loads no
  model weights; its KV bytes are unknown (None), never 0.
* ``model.backend`` enters the config hash (an engine's answers are not snapeval's); a run that leaves it
  unset keeps today's hash; ``model.backend_args`` is stored but not hashed, and a secret in it is refused.
* An unreachable ``base_url`` is refused in one line before torch; a client that fails mid-run ends the
  run in one line, closed as failed. The real engine, llama.cpp's server: tests/test_engine_llama_cpp.py.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys

import pytest

from snapeval.backends.serve import free_port
from snapeval.configs.backend import backend_args_check, backend_check, client_arguments
from snapeval.errors import SnapevalError
from snapeval.results import config_hash
from snapeval.run import runner

from .conftest import compose_config

ECHO = "snapeval-test-passkey-reader"


@pytest.fixture(scope="module")
def passkey_reader():
    """An lm-eval model that answers with the last number of each prompt (a passkey task's needle), and
    records what it was sent."""
    from lm_eval.api.model import LM
    from lm_eval.api.registry import MODEL_REGISTRY, register_model

    sent: list[tuple[str, dict]] = []

    class PasskeyReader(LM):
        def __init__(self, **arguments) -> None:
            super().__init__()
            self.arguments = arguments

        def generate_until(self, requests, disable_tqdm=False):
            sent.extend(request.args for request in requests)
            return [" " + (re.findall(r"\d{3,}", request.args[0]) or [""])[0] for request in requests]

        def loglikelihood(self, requests):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

    if ECHO not in MODEL_REGISTRY:
        register_model(ECHO)(PasskeyReader)
    return sent


def test_a_run_through_an_lm_eval_backend_stores_its_scored_answers(
    passkey_reader, tiny_llama_overrides, tmp_path, monkeypatch
):
    from snapeval.run import evaluation

    monkeypatch.setattr(evaluation.Loaded, "model", property(lambda self: pytest.fail("weights loaded")))
    db = tmp_path / "engine.db"
    cfg = compose_config(
        *tiny_llama_overrides,
        f"model.backend=lm_eval:{ECHO}",
        "model.backend_args=model=tiny,num_concurrent=2",
        "run.limit=3",
        "task.context_length=512",
        "run.progress=false",
        f"run.db={db}",
    )
    [summary] = runner.run(cfg)
    assert summary.n == 3 and summary.accuracy == 1.0
    assert len(passkey_reader) == 3
    prompt, generation = passkey_reader[0]
    assert generation == {
        "until": [],
        "max_gen_toks": cfg["task"]["max_new_tokens"],
        "do_sample": False,
        "temperature": 0.0,
    }
    assert "<|im_start|>user" in prompt  # the chat template, applied by snapeval
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT score, kv_bytes, generated_tokens FROM samples").fetchall()
        stored = json.loads(connection.execute("SELECT config FROM runs").fetchone()[0])
    assert [row[:2] for row in rows] == [(1.0, None)] * 3 and all(row[2] > 0 for row in rows)
    assert stored["model"]["backend"] == f"lm_eval:{ECHO}"
    assert stored["model"]["backend_args"] == "model=tiny,num_concurrent=2"


def test_the_backend_is_hashed_its_arguments_stored_and_secrets_refused():
    plain = compose_config("run.limit=1")
    engine = compose_config("run.limit=1", "model.backend=lm_eval:local-completions")
    moved = compose_config(
        "run.limit=1", "model.backend=lm_eval:local-completions", "model.backend_args=base_url=x"
    )
    assert config_hash(plain) != config_hash(engine) == config_hash(moved)
    assert "backend" not in json.dumps(plain["model"]) or plain["model"]["backend"] is None
    assert backend_check("snapeval") is None and backend_check("lm_eval:vllm") is None
    assert backend_check("vllm") and backend_check("lm_eval:")
    assert "OPENAI_API_KEY" in backend_args_check("base_url=x,api_key=sk-1")
    assert "no k=v" in backend_args_check("base_url")
    assert client_arguments("base_url=x,tokenized_requests=True") == {
        "tokenizer_backend": "none",
        "tokenized_requests": "True",
        "base_url": "x",
    }


def test_an_unreachable_engine_is_refused_in_one_line_before_torch(torch_refused, tmp_path):
    port = free_port(set())  # nothing listens there
    command = [sys.executable, "-m", "snapeval", "model.backend=lm_eval:local-completions"]
    command += [f"model.backend_args=base_url=http://127.0.0.1:{port}/v1/completions,model=m"]
    command += ["run.limit=1", f"run.db={tmp_path / 'u.db'}"]
    done = subprocess.run(command, capture_output=True, text=True, env=torch_refused, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"error: model.backend_args: nothing answers at base_url http://127.0.0.1:{port}/v1/completions "
        "(Connection refused): start the server, or give its address"
    ]
    assert not (tmp_path / "u.db").exists()


def test_an_engine_that_fails_mid_run_ends_it_in_one_line_and_closes_it(tiny_llama_overrides, tmp_path):
    """The client's retries spent (here: it raises at once): a SnapevalError naming the backend, the run
    closed as failed, never left running."""
    from lm_eval.api.model import LM
    from lm_eval.api.registry import MODEL_REGISTRY, register_model

    class Broken(LM):
        def __init__(self, **arguments) -> None:
            super().__init__()

        def generate_until(self, requests, disable_tqdm=False):
            raise ConnectionError("HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded")

        loglikelihood = loglikelihood_rolling = generate_until

    if "snapeval-test-broken" not in MODEL_REGISTRY:
        register_model("snapeval-test-broken")(Broken)
    db = tmp_path / "broken.db"
    cfg = compose_config(
        *tiny_llama_overrides,
        "model.backend=lm_eval:snapeval-test-broken",
        "run.limit=2",
        "task.context_length=512",
        "run.progress=false",
        f"run.db={db}",
    )
    expected = r"^model\.backend: the engine failed to answer: the connection failed \(HTTPConnectionPool\("
    with pytest.raises(SnapevalError, match=expected + r".*\), its retries spent: the server stopped"):
        runner.run(cfg)
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT status FROM runs").fetchall() == [("failed",)]


def test_both_answerers_take_the_runners_calls_as_the_seam_declares():
    """snapeval's batcher and the lm-eval answerer: the members of :class:`Answerer`, with its signatures."""
    import inspect

    from snapeval.backends import Answerer
    from snapeval.backends.lm_eval import LmEvalAnswerer
    from snapeval.decode.continuous import ContinuousBatcher

    for implementation in (ContinuousBatcher, LmEvalAnswerer):
        for name in ("reserve", "run"):
            declared = inspect.signature(getattr(Answerer, name))
            assert inspect.signature(getattr(implementation, name)) == declared, (implementation, name)
