"""A hostile tester's configs for ``python -m snapeval`` and ``python -m snapeval.commands.gate``: each
ends in one line ``error: <field>: <what is wrong>`` with exit code 2, never a traceback.

The cases run in-process through the front door (:func:`snapeval.__main__.check_before_hydra`) or the gate's
``main``; those the config alone decides run once more, each timed, in an interpreter where torch cannot be
imported (they answer before torch loads). Real commands only where a process is the point: a Hydra setting
on the command line, a multirun whose every point fails, Ctrl-C while torch loads. No model weights load.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from snapeval.cli import keep_interrupts
from snapeval.commands.gate import main as gate_main
from snapeval.configs import grid as grid_module
from snapeval.configs.compose import compose_config
from snapeval.configs.grid import grid_points, point_count
from snapeval.configs.setting import effective_params
from snapeval.configs.task import ruler_kind
from snapeval.results import identity
from snapeval.run.plan import check_inputs
from snapeval.tasks.ruler import KINDS
from tests.test_bad_inputs import refusal

BUDGETS = ",".join(str(200 + i) for i in range(10_000))
MODEL_CONFIGS = "model configs: deepseek-r1, deepseek-r1-distill-llama-8b"
HUGE_BUDGET = "cache.budget=10000000000000000000"
SMOLLM2_POSITIONS = "8,192 trained positions (max_position_embeddings)"
TOO_MANY_SLOTS = (
    "cache.budget: must be at most 16,777,216 slots (more positions than any model has), got 10000"
)
CONFIG_ONLY = [  # decided by the config alone: refused before torch loads, in about a second
    (["grid=5"], "grid: must be a mapping with keys cache, params, share_prefill, got 5"),
    (
        ["grid={cache:[snapstream], params:[1, 2]}"],
        "grid.params: must be a mapping of parameters to a value or a list of values, got [1, 2]",
    ),
    (
        ["grid={cache:[snapstream], params: {budget: [[128, 256]]}}"],
        "grid.params.budget: must be a value or a list of values, got [[128, 256]]",
    ),
    (
        ["grid={cache:[snapstream], params: {budget: {a: 1}}}"],
        "grid.params.budget: must be a value or a list of values, got {'a': 1}",
    ),
    (
        [f"grid={{cache:[snapstream], params:{{budget: [{BUDGETS}]}}}}"],
        "grid: a list of 10,000 values makes as many points; a grid runs at most 1,000: split it",
    ),
    (
        [f"grid={{cache:[snapkv], params:{{budget: {list(range(200, 480))}, kernel: [1,3,5,7,9]}}}}"],
        "grid: 1,400 points; a grid runs at most 1,000: split it into smaller grids",
    ),
    (
        ["model.name=../gates/ci"],
        f"model.name: must be a name or a Hub id (owner/name), not a path ({MODEL_CONFIGS}",
    ),
    (
        ["cache=speculative_prefill", "cache.draft=../gates/ci"],
        "cache.draft: no model '../gates/ci': give self, a model config (deepseek-r1, deepseek-r1-distill",
    ),
    (
        ["cache=speculative_prefill", "cache.draft=../exp/smoke"],
        "cache.draft: no model '../exp/smoke': give self, a model config (deepseek-r1, deepseek-r1-distill",
    ),
    (
        ["generation.num_samples=9223372036854775807"],
        "generation.num_samples: must be an integer <= 10000, got 9223372036854775807",
    ),
    (
        ["generation.num_samples=10000", "run.limit=101"],
        "generation.num_samples: 101 prompts x 10,000 draws make 1,010,000 requests; a run makes at most "
        "1,000,000",
    ),
    (
        ["model.config_overrides={num_hidden_layers: 0}"],
        "model.config_overrides.num_hidden_layers: must be an integer >= 1, got 0",
    ),
    (["cache=rkv", HUGE_BUDGET], TOO_MANY_SLOTS),
    (["cache=sage_kv", HUGE_BUDGET], TOO_MANY_SLOTS),
    (["cache=streaming_llm", HUGE_BUDGET], TOO_MANY_SLOTS),
    (
        ["task.kind=nope"],
        "task.kind: must be one of niah_multikey, niah_multiturn, niah_multivalue, niah_single, passkey, "
        "variable_tracking, vt_multiturn, got 'nope'",
    ),
    (
        ["task.context_length=16"],
        "task.context_length: context_length 16 is too small: the instructions, needles and question alone "
        "take more than 48 tokens",
    ),
    (["cache.method=nosuch"], "cache.method: unknown method 'nosuch'; choose one of full, kvpress, rkv,"),
    (["cache.method=nosuch.mod:Cls"], "cache.method: cannot load 'nosuch.mod:Cls': No module named 'nosuch'"),
    (
        ["+exp=smoke", "+grid.params.nope=1"],
        "grid.params.nope: no method of this grid (full, snapstream) takes it",
    ),
    (
        ["grid={cache:[snapstream, nosuch]}"],
        "grid.cache: no cache config 'nosuch'; choose from full, kvpress,",
    ),
    (["cache.budget=٣"], """cache.budget: cannot parse '٣'; quote non-ASCII values: 'cache.budget="٣"'"""),
    (["run.limit=😀"], """run.limit: cannot parse '😀'; quote non-ASCII values: 'run.limit="😀"'"""),
    (["grid.params.budget=[1,é]"], """grid.params.budget: cannot parse '[1,é]'; quote non-ASCII values: """),
    (
        ["model.max_context=20000", "task.context_length=10000"],
        f"task.context_length: 10,000 tokens and 32 new ones run past smollm2-135m's {SMOLLM2_POSITIONS}: "
        "give at most 8160, or set model.allow_past_trained_positions=true",
    ),
]


@pytest.mark.parametrize("args,expected", CONFIG_ONLY, ids=[" ".join(a)[:60] for a, _ in CONFIG_ONLY])
def test_a_hostile_config_is_refused_in_one_line(args, expected, tmp_path):
    assert refusal(tmp_path, *args).startswith(expected)


def test_the_schema_knows_every_ruler_kind():
    assert ruler_kind(object()) == "one of " + ", ".join(sorted(KINDS))


def model_folder(tmp_path: Path, **config: object) -> Path:
    """A model folder holding only a tiny Llama's ``config.json`` (``config`` over it): no weights."""
    folder = tmp_path / "model"
    folder.mkdir()
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64}
    llama |= {"intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
    llama |= {"num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 2048}
    (folder / "config.json").write_text(json.dumps(llama | config))
    return folder


def test_a_model_folder_whose_config_has_no_heads(tmp_path):
    folder = model_folder(tmp_path, num_attention_heads=0)
    message = refusal(tmp_path, f"model.pretrained={folder}")
    assert (
        message
        == f"model.pretrained: {folder}/config.json: num_attention_heads must be an integer >= 1, got 0"
    )


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            "{vocab_size: 10}",
            "model.config_overrides.vocab_size: 10 does not fit the weights, made for 512: overrides may "
            "change how the model runs (rope_parameters, ...), not its weights' shapes",
        ),
        (
            "{hidden_act: nope}",
            "model.config_overrides.hidden_act: unknown activation 'nope'; choose one of gelu,",
        ),
        (
            "{rms_norm_eps: abc}",
            "model.config_overrides: the model cannot be built with them: Validation error for field "
            "'rms_norm_eps'",
        ),
    ],
)
def test_config_overrides_that_break_the_model_are_refused_before_weights(overrides, expected, tmp_path):
    folder = model_folder(tmp_path)  # no weights: nothing could load them
    assert refusal(tmp_path, f"model.pretrained={folder}", f"model.config_overrides={overrides}").startswith(
        expected
    )


def test_config_overrides_compose_over_a_model_that_sets_none():
    """OmegaConf cannot merge a mapping into a null ``Dict`` node: the field is ``Any``, with its check."""
    model = compose_config("model.config_overrides={rope_theta: 20000.0}")["model"]
    assert model["config_overrides"] == {"rope_theta": 20000.0}
    assert compose_config()["model"].get("config_overrides") is None


def aime_rows(tmp_path: Path, problem: str) -> list[str]:
    """A one-row AIME data file of ``problem`` with 4,096 new tokens, over a window of 20,000 tokens."""
    rows = tmp_path / f"{len(problem)}.jsonl"
    rows.write_text(json.dumps({"id": 1, "problem": problem, "answer": "2"}) + "\n")
    return [
        "task=aime24",
        f"task.metadata.data_path={rows}",
        "task.max_new_tokens=4096",
        "model.max_context=20000",
    ]


def test_a_data_task_past_the_trained_positions_runs_only_with_the_override(tmp_path, capsys):
    """A window past the model's positions is refused where a row with its answer may pass them (a row
    counted in bytes), and runs with ``model.allow_past_trained_positions``, which is stored, unhashed."""
    long = aime_rows(tmp_path, "word " * 8000)
    past = (
        "a window of 20,000 tokens lets prompts and 4,096 new ones run past smollm2-135m's "
        + SMOLLM2_POSITIONS
    )
    assert refusal(tmp_path, *long).startswith(f"model.max_context: {past}: give at most 8192, or set")
    check_inputs(compose_config(*aime_rows(tmp_path, "1 + 1?")))  # short rows stay within the positions
    allowed = compose_config(*long, "model.allow_past_trained_positions=true")
    check_inputs(allowed)
    note = f"note: model.max_context: {past}, as model.allow_past_trained_positions allows\n"
    assert capsys.readouterr().err == note
    stored, digest = identity(allowed)
    assert stored["model"]["allow_past_trained_positions"] is True
    assert digest == identity(compose_config(*long))[1]


def test_grid_points_are_made_per_method_not_over_the_product_of_all_parameters(monkeypatch):
    """Setting up a grid is linear in its points: a method's points sweep only the parameters it takes."""
    calls = []
    monkeypatch.setattr(
        grid_module, "effective_params", lambda cache: calls.append(1) or effective_params(cache)
    )
    params = {"window": list(range(8, 38)), "sinks": list(range(30)), "kernel": [1, 3, 5]}
    cfg = compose_config(f"grid={{cache:[full,snapkv,streaming_llm],params:{params}}}".replace("'", ""))
    points = grid_points(cfg)
    assert len(points) == point_count(cfg["grid"]) == 1 + 30 * 3 + 30 == len(calls)  # not 3 x 2,700


def gate_spec(tmp_path: Path, task: list[str], cache: list[str]) -> Path:
    gate = {"name": "hostile", "task": task, "cache": cache, "min_retained": 0.8, "min_n": 2}
    path = tmp_path / "gates.yaml"
    path.write_text(yaml.safe_dump([gate]))
    return path


GATE_CASES = [
    (["task=ruler_passkey"], ["cache.method=nosuch"], "[0].cache: cache.method: unknown method 'nosuch'"),
    (["task.kind=nope"], ["cache=snapstream"], "[0].task: task.kind: must be one of niah_multikey,"),
    (["task.context_length=16"], ["cache=snapstream"], "[0].task: task.context_length: context_length 16 is"),
    (
        ["task=ruler_passkey"],
        ["cache=snapkv", "cache.kernel=4"],
        "[0].cache: cache.kernel: must be a positive odd",
    ),
    (
        ["task=ruler_passkey"],
        ["+exp=budget_search"],
        "[0].cache: '+exp=budget_search' is not a cache setting: give cache=NAME and cache.KEY=VALUE",
    ),
    (
        ["task=ruler_passkey"],
        ["+grid={cache: [snapstream], params: {budget: [128, 192]}}"],
        "[0].cache: '+grid={cache: [snapstream], params: {budget: [128, 192]}}' is not a cache setting",
    ),
    (["task=ruler_passkey"], ["task.context_length=600"], "[0].cache: 'task.context_length=600' is not a"),
    (["task=ruler_passkey"], ["cache=full"], "[0].cache: cache.method: must be a compressed cache, got full"),
    (["task=ruler_passkey", "+exp=smoke"], ["cache=snapstream"], "[0].task: grid: a gate runs one cache"),
    (["task=ruler_passkey", "cache.budget=100"], ["cache=snapkv"], "[0].task: 'cache.budget=100' sets the"),
]


@pytest.mark.parametrize("task,cache,expected", GATE_CASES)
def test_the_gate_checks_every_config_before_running_any(
    task, cache, expected, tmp_path, monkeypatch, capsys
):
    def no_run(*args, **kwargs):
        raise AssertionError("a gate ran before its configs were checked")

    monkeypatch.setattr("snapeval.run.runner.run", no_run)
    monkeypatch.setattr("snapeval.run.runner.execute", no_run)  # what the gate runs its plans with
    spec = gate_spec(tmp_path, task, cache)
    assert gate_main(["--spec", str(spec), "--db", str(tmp_path / "gate.sqlite")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {spec}{expected}") and error.count("\n") == 1, error


PROBE = """
import contextlib, io, json, sys
from snapeval.__main__ import check_before_hydra
from snapeval.errors import SnapevalError
from snapeval.commands.gate import main as gate_main
cases, gates = json.loads(sys.argv[1])
answers = []
for args in cases:
    try:
        check_before_hydra(args)
        answers.append(None)
    except SnapevalError as exc:
        answers.append(str(exc))
for spec in gates:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = gate_main(["--spec", spec, "--db", spec + ".sqlite"])
    answers.append(err.getvalue() if code == 2 else None)
print(json.dumps(answers))
"""


def test_config_decided_cases_answer_before_torch_can_load(tmp_path, torch_refused):
    """Every config-only case, in a process where ``import torch`` fails (its speed: the README's
    measured seconds; tests assert behaviour, not timings)."""
    db = f"run.db={tmp_path / 'db.sqlite'}"
    folder = model_folder(tmp_path, num_attention_heads=0)
    cases = [[db, *args] for args, _ in CONFIG_ONLY] + [[db, f"model.pretrained={folder}"]]
    expected = [message for _, message in CONFIG_ONLY]
    expected.append(f"model.pretrained: {folder}/config.json: num_attention_heads must be")
    gates = []
    for index, (task, cache, message) in enumerate(GATE_CASES):
        (tmp_path / str(index)).mkdir()
        gates.append(str(gate_spec(tmp_path / str(index), task, cache)))
        expected.append(f"error: {gates[-1]}{message}")
    probe = [sys.executable, "-c", PROBE, json.dumps([cases, gates])]
    result = subprocess.run(probe, capture_output=True, text=True, timeout=120, env=torch_refused)
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout)
    pairs = list(zip(answers, expected, strict=True))
    assert [(message or "")[: len(prefix)] for message, prefix in pairs] == expected


def command(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 120):
    argv = [sys.executable, "-m", "snapeval", *args, f"run.db={tmp_path / 'db.sqlite'}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def test_a_hydra_setting_does_not_skip_the_front_door(tmp_path, torch_refused):
    result = command(tmp_path, "hydra.job.name=x", "cache=snapstream", "cache.budget=abc", env=torch_refused)
    assert (result.returncode, result.stderr) == (2, "error: cache.budget: must be an integer, got 'abc'\n")


@pytest.mark.slow  # a real command (about 10 s): .ci/run runs it with the slow tests
def test_a_multirun_whose_every_point_fails_exits_2(tmp_path):
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    result = command(tmp_path, "-m", "cache=snapstream", "cache.budget=50", "run.limit=1", sweep, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines()[-1] == "error: sweep: no point finished (1 failed; errors above)"
    assert "Traceback" not in result.stderr


class DropsCtrlC:
    """An object whose finalizer gets Ctrl-C: Python prints that KeyboardInterrupt and drops it."""

    def __del__(self) -> None:
        raise KeyboardInterrupt


def test_a_ctrl_c_python_drops_in_a_finalizer_still_ends_the_front_door(capsys):
    with pytest.raises(KeyboardInterrupt), keep_interrupts():
        DropsCtrlC()  # collected at once: its KeyboardInterrupt goes to sys.unraisablehook
        went_on = True
    assert went_on and capsys.readouterr().err == ""  # kept silent, raised as the block ends


def hear_ctrl_c() -> None:
    """Give the program Ctrl-C as a terminal would, even where pytest itself runs with SIGINT ignored (a
    background job of a non-interactive shell, `nohup ... &`), which a child would otherwise inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_torch_loads_ends_in_one_line(tmp_path):
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc to see when torch starts loading")
    argv = [sys.executable, "-m", "snapeval", f"run.db={tmp_path / 'db.sqlite'}", "run.limit=1"]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=hear_ctrl_c,
    )
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        if "libtorch" in Path(f"/proc/{process.pid}/maps").read_text():
            break  # the front door's schema checks passed: torch is loading (making the run plan)
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert (process.returncode, err) == (
        130,
        "interrupted: every sample stored so far is kept; the same command resumes the run\n",
    )
