"""The engine's guard on transformers' private plumbing: the cache reaches the snapeval attention under
every convention transformers used (``past_key_values`` before 5.24, ``cache`` from 5.24, a future name
found from the signature), and a cache the engine was bypassed for never yields a result: generate, the
batcher, the runner and the lm-eval model each stop with one line, before anything is stored."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from snapeval.cache import attention, build_cache, install
from snapeval.cache.slots import SlotCache
from snapeval.couplings import CACHE_PARAMETERS, transformers_version
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.generation import generate
from snapeval.errors import SnapevalError
from tests.bypass import hide_the_cache
from tests.families import FAMILIES, SMOLLM2_VOCAB, deepseek_v3_model

from .conftest import TINY_VOCAB

BYPASSED = "attention without the snapeval cache: the engine was bypassed"
PROMPT = list(range(3, 83))  # 80 tokens
REPO = Path(__file__).resolve().parents[1]


class Keyword(torch.nn.Module):
    def forward(self, hidden_states, attention_mask=None, *, cache=None, **kwargs):
        return cache


class Positional(torch.nn.Module):
    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        return past_key_values


class Annotated(torch.nn.Module):
    def forward(self, hidden_states, kv_memory: SlotCache | None = None, **kwargs):  # a future name
        return kv_memory


class Cacheless(torch.nn.Module):
    def forward(self, hidden_states, attention_mask=None, **kwargs):
        return hidden_states


@pytest.mark.parametrize(
    ("module", "names", "place"),
    [
        (Keyword(), ("cache", "past_key_values"), None),
        (Positional(), ("past_key_values", "cache"), 3),
        (Annotated(), ("kv_memory", *CACHE_PARAMETERS), 1),
    ],
)
def test_the_cache_is_found_under_the_name_the_attention_forward_declares(module, names, place):
    assert attention.cache_names(module) == (names, place)


@pytest.mark.parametrize("passed_as", ["cache", "past_key_values", "positional"])
def test_the_wrapped_forward_hands_the_cache_on_however_it_is_passed(passed_as):
    seen = {}

    def forward(hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        seen.update(kwargs)

    wrapped = attention._passing_the_cache(forward, ("past_key_values", "cache"), 3)
    marker = object()
    if passed_as == "positional":
        wrapped(None, None, None, marker)
    else:
        wrapped(None, None, None, **{passed_as: marker})
    assert seen[attention.CACHE_KWARG] is marker


def test_an_attention_that_takes_no_cache_is_refused_in_one_line_naming_the_version_and_module():
    with pytest.raises(SnapevalError) as refused:
        attention.cache_names(Cacheless())
    message = str(refused.value)
    assert message.startswith(
        f"model: transformers {transformers_version()}: Cacheless.forward takes no cache"
    )
    assert "supported: 5.2.0-" in message and "\n" not in message


def test_install_passes_the_cache_under_the_installed_transformers_own_name():
    model = install(FAMILIES["llama"](TINY_VOCAB))
    names, _ = attention.cache_names(model.model.layers[0].self_attn)
    expected = "cache" if Version(transformers_version()) >= Version("5.24") else "past_key_values"
    assert names[0] == attention.cache_keyword(model) == expected


@pytest.fixture
def bypassed(monkeypatch) -> torch.nn.Module:
    """A fresh tiny Llama installed by an engine that does not know the name its cache arrives under."""
    hide_the_cache(monkeypatch)
    model = install(FAMILIES["llama"](TINY_VOCAB))
    model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("method", [{"method": "snapkv", "budget": 48, "window": 8}, {"method": "full"}])
def test_generate_stops_at_the_first_prefill_the_engine_was_bypassed_for(bypassed, method):
    cache = build_cache(method)
    with pytest.raises(SnapevalError, match=f"called layer 0's {BYPASSED}"):
        generate(bypassed, PROMPT, cache, max_new_tokens=4, stop_ids=set())
    with pytest.raises(SnapevalError, match=BYPASSED):
        bypassed.generate(torch.tensor([PROMPT]), past_key_values=build_cache(method), max_new_tokens=2)


def test_a_one_layer_model_is_checked_when_its_forward_ends(monkeypatch):
    hide_the_cache(monkeypatch)
    model = FAMILIES["llama"](TINY_VOCAB)
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    install(model)
    with pytest.raises(SnapevalError, match=f"called layer 0's {BYPASSED}"):
        model(
            input_ids=torch.tensor([PROMPT]),
            **{attention.cache_keyword(model): build_cache({"method": "full"})},
        )


def test_a_model_not_prepared_by_install_is_refused_as_bypassed():
    model = FAMILIES["llama"](TINY_VOCAB)  # SDPA: transformers' attention, no snapeval attention
    with pytest.raises(SnapevalError, match=BYPASSED):
        generate(
            model,
            PROMPT,
            build_cache({"method": "snapstream", "budget": 48, "window": 8, "ring": 16}),
            2,
            set(),
        )


def test_the_batcher_stops_when_a_decode_step_went_around_the_engine(tiny_llama):
    """Prefill through the engine, then a step whose attention is transformers' own: the rows' masks were
    never taken, so the step is refused rather than decoded against slots a row does not hold."""
    batcher = ContinuousBatcher(tiny_llama, rows=2)
    requests = [
        Request(tuple(PROMPT), {"method": "snapstream", "budget": 48, "window": 8, "ring": 16}, 4, tag=i)
        for i in (0, 1)
    ]
    answers = []
    batcher.run(requests, answers.append)  # through the engine: fine
    assert len(answers) == 2
    try:
        tiny_llama.set_attn_implementation("sdpa")
        with pytest.raises(SnapevalError, match=f"called layer 0's {BYPASSED}"):
            batcher.run(requests, answers.append)
    finally:
        tiny_llama.set_attn_implementation(attention.ATTENTION_NAME)
    assert len(answers) == 2


def bypassed_command(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose engine does not know the name its cache arrives under."""
    setup = f"import sys; sys.path.insert(0, {str(REPO)!r}); import tests.bypass as b; b.hide_the_cache(); "
    return subprocess.run(
        [sys.executable, "-c", setup + code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        check=False,
    )


@pytest.mark.slow  # .ci/run runs it
def test_the_runner_exits_2_in_one_line_and_stores_no_row(tiny_llama_overrides, tmp_path):
    db = tmp_path / "results.sqlite"
    overrides = [
        *tiny_llama_overrides,
        "cache=snapstream",
        "cache.budget=64",
        "cache.window=8",
        "cache.ring=16",
        "run.limit=2",
        f"run.db={db}",
    ]
    overrides.append("task.context_length=256")
    code = f"import runpy; sys.argv = ['snapeval', *{overrides!r}]; "
    code += "runpy.run_module('snapeval', run_name='__main__')"
    done = bypassed_command(code, tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: transformers ")
    assert BYPASSED in done.stderr
    with sqlite3.connect(db) as connection:
        assert connection.execute("select count(*) from samples").fetchone() == (0,)
        assert connection.execute("select status from runs").fetchall() == [("failed",)]


def test_the_lm_eval_model_stops_in_one_line(tiny_llama_folder, tmp_path, monkeypatch):
    from lm_eval.api.instance import Instance

    from snapeval.commands.lm_eval_model import SnapStreamLM

    hide_the_cache(monkeypatch)
    model = FAMILIES["llama"](SMOLLM2_VOCAB)  # a folder of its own
    model.save_pretrained(tmp_path / "model")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_llama_folder / name).exists():
            (tmp_path / "model" / name).write_bytes((tiny_llama_folder / name).read_bytes())
    lm = SnapStreamLM(pretrained=str(tmp_path / "model"), method="snapkv", budget=48, window=8)
    request = Instance("loglikelihood", doc={}, arguments=("one two three four five six", " seven"), idx=0)
    with pytest.raises(SnapevalError, match=BYPASSED):
        lm.loglikelihood([request], disable_tqdm=True)
    until = Instance("generate_until", doc={}, arguments=("one two three", {"max_gen_toks": 4}), idx=0)
    with pytest.raises(SnapevalError, match=BYPASSED):
        lm.generate_until([until], disable_tqdm=True)


@pytest.mark.slow  # a real command (about 10 s): .ci/run runs it with the slow tests
def test_the_lm_eval_cli_exits_2_in_one_line(tiny_llama_folder, tmp_path):
    from snapeval.paths import LM_EVAL_TASKS_DIR

    arguments = ["lm_eval", "--model", "snapeval", "--model_args"]
    arguments += [f"pretrained={tiny_llama_folder},method=snapkv,budget=48,window=8"]
    arguments += [
        "--include_path",
        str(LM_EVAL_TASKS_DIR),
        "--tasks",
        "snapeval_ruler_passkey",
        "--limit",
        "1",
    ]
    code = f"sys.argv = {arguments!r}; from lm_eval.__main__ import cli_evaluate; cli_evaluate()"
    done = bypassed_command(code, tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert BYPASSED in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("latent_cache", [True, False])
def test_mla_is_refused_in_one_line_where_transformers_caches_it_per_head(monkeypatch, latent_cache):
    monkeypatch.setattr(attention, "at_least", lambda version: latent_cache)
    model = deepseek_v3_model(TINY_VOCAB)
    if latent_cache:
        install(model)
        return
    with pytest.raises(SnapevalError) as refused:
        install(model)
    assert str(refused.value) == (
        f"model: deepseek_v3: MLA needs transformers >= 5.15.0, which caches its latent "
        f"(installed: {transformers_version()})"
    )
