"""``lm_eval --model snapeval``: the installed ``.pth`` hook registers snapeval's model with lm-eval.

Each test starts a fresh interpreter, as a user's shell would: the hook must work from start-up alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from snapeval.paths import LM_EVAL_TASKS_DIR

from .paths import SHARED_DATA, needs_shared_data


def fresh_python(code: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def lm_eval_executable() -> str:
    beside_python = Path(sys.executable).with_name("lm_eval")
    return str(beside_python) if beside_python.exists() else shutil.which("lm_eval")


def test_a_fresh_interpreter_finds_snapeval_its_alias_and_lm_evals_own_models(tmp_path):
    out = fresh_python(
        "from lm_eval.api.registry import get_model\n"
        "model = get_model('snapeval')\n"
        "print(model.__module__, model.__name__, get_model('snapstream') is model, get_model('hf').__name__)",
        tmp_path,
    )
    assert out.split() == ["snapeval.commands.lm_eval_model", "SnapStreamLM", "True", "HFLM"]


def test_a_regular_wheel_carries_the_configs_and_task_definitions_apart_from_the_task_modules(tmp_path):
    """``pip install .`` (not editable): ``conf/`` and the top-level ``tasks/`` travel inside the package,
    the definitions as ``snapeval/lm_eval_tasks`` (``snapeval/tasks`` is the Python package of task
    modules), and :mod:`snapeval.paths` finds both from outside any checkout."""
    root = Path(__file__).resolve().parents[1]
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            tmp_path,
            root,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = tmp_path.glob("snapeval-*.whl")
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    definitions = sorted(p.name for p in (installed / "snapeval/lm_eval_tasks").iterdir())
    assert definitions == sorted(p.name for p in (root / "tasks").iterdir() if p.is_file())
    assert "snapeval_aime24.yaml" in definitions and "utils.py" in definitions
    assert not list((installed / "snapeval/tasks").glob("*.yaml"))  # the modules' package stays apart
    assert (installed / "snapeval_lm_eval.pth").is_file()
    assert (installed / "snapeval/conf/config.yaml").is_file()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from snapeval.paths import CONF_DIR, LM_EVAL_TASKS_DIR\n"
            "from snapeval.tasks import task_names\n"
            "print(CONF_DIR, LM_EVAL_TASKS_DIR, len(task_names()))",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
        timeout=120,
        check=True,
    ).stdout.split()
    assert out == [
        str(installed / "snapeval/conf"),
        str(installed / "snapeval/lm_eval_tasks"),
        str(sum(name.endswith(".yaml") for name in definitions)),
    ]


def test_start_up_hook_imports_nothing_heavy(tmp_path):
    out = fresh_python(
        "import sys\n"
        "from snapeval.commands.lm_eval_plugin import LmEvalModelsFinder\n"
        "modules = ('torch', 'lm_eval', 'snapeval.commands.lm_eval_model')\n"
        "print(sorted(m for m in modules if m in sys.modules),\n"
        "      sum(isinstance(f, LmEvalModelsFinder) for f in sys.meta_path))",
        tmp_path,
    )
    assert out == "[] 1"


@pytest.mark.parametrize(
    "task,extra_args,metric,pretrained",
    [
        pytest.param(  # the path under test, on the session's random-weight Llama with SmolLM2's tokenizer
            "snapeval_ruler_passkey",
            ["--metadata", '{"context_length": 384, "num_prompts": 2}'],
            "score,none",
            None,
            marks=pytest.mark.slow,  # lm-eval's CLI end to end (.ci/run runs it)
        ),
        pytest.param(
            "snapeval_aime24",
            ["--gen_kwargs", "max_gen_toks=64"],
            "acc,none",
            "smollm2-135m",
            marks=[pytest.mark.slow, needs_shared_data],
        ),
    ],
)
def test_lm_eval_cli_evaluates_a_task_under_snapeval(request, tmp_path, task, extra_args, metric, pretrained):
    pretrained = pretrained or request.getfixturevalue("tiny_llama_folder")
    results_dir = tmp_path / "out"
    done = subprocess.run(
        [
            lm_eval_executable(),
            "--model",
            "snapeval",
            "--model_args",
            f"pretrained={pretrained},method=snapstream,budget=96,window=16,kernel=5",
            "--include_path",
            str(LM_EVAL_TASKS_DIR),
            "--tasks",
            task,
            *extra_args,
            "--limit",
            "2",
            "--apply_chat_template",
            "--log_samples",
            "--output_path",
            str(results_dir),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "SNAPEVAL_DATA_DIR": str(SHARED_DATA)},
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [results_file] = results_dir.rglob("results_*.json")
    results = json.loads(results_file.read_text())
    assert results["config"]["model"] == "snapeval"
    assert results["config"]["model_args"]["budget"] == 96
    assert 0.0 <= results["results"][task][metric] <= 1.0
    [samples_file] = results_dir.rglob(f"samples_{task}_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert len(samples) == 2
    assert all(sample["resps"][0][0].strip() for sample in samples)  # the model answered something


@pytest.mark.slow  # .ci/run runs it
def test_a_bad_model_argument_under_the_lm_eval_cli_is_one_line(tmp_path):
    done = subprocess.run(
        [
            lm_eval_executable(),
            "--model",
            "snapstream",
            "--model_args",
            "pretrained=smollm2-135m,method=nope",
            "--include_path",
            str(LM_EVAL_TASKS_DIR),
            "--tasks",
            "snapeval_ruler_passkey",
            "--limit",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (
        done.stderr.strip().splitlines()[-1].startswith("error: cache.method: unknown method 'nope'; choose")
    )
