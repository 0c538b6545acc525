"""``lm_eval --model snapeval``: the installed ``.pth`` hook registers snapeval's model with lm-eval.

Each test starts a fresh interpreter, as a user's shell would: the hook must work from start-up alone.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from snapeval.commands.lm_eval_tasks import take_in_tasks, with_snapeval_tasks
from snapeval.paths import LM_EVAL_TASKS_DIR

from .paths import SHARED_DATA, needs_shared_data

ROOT = Path(__file__).resolve().parents[1]


def fresh_python(code: str, cwd: Path) -> str:
    return in_venv(sys.executable, code, cwd)


def in_venv(python: str, code: str, cwd: Path) -> str:
    """What ``python -c code`` prints, run in ``cwd``."""
    done = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def built_wheel(folder: Path) -> Path:
    """``pip wheel .`` of the checkout into ``folder``, offline (the build backend of this environment)."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", folder, ROOT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = folder.glob("snapeval-*.whl")
    return wheel


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
    wheel = built_wheel(tmp_path)
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    definitions = sorted(p.name for p in (installed / "snapeval/lm_eval_tasks").iterdir())
    assert definitions == sorted(p.name for p in (ROOT / "tasks").iterdir() if p.is_file())
    assert "snapeval_aime24.yaml" in definitions and "utils.py" in definitions
    assert not list((installed / "snapeval/tasks").glob("*.yaml"))  # the modules' package stays apart
    assert (installed / "snapeval_lm_eval.pth").is_file()
    assert (installed / "snapeval/conf/config.yaml").is_file()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from snapeval.paths import CONF_DIR, LM_EVAL_TASKS_DIR\n"
            "from snapeval.tasks.lm_eval_export import exported_names\n"
            "print(CONF_DIR, LM_EVAL_TASKS_DIR, len(exported_names()))",
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


@pytest.mark.slow  # a wheel installed, then lm-eval's CLI end to end (.ci/run runs it)
def test_lm_evals_cli_finds_an_installed_wheels_tasks_from_another_folder(tmp_path, tiny_llama_folder):
    """``pip install .`` (not editable) into a fresh environment, then ``lm_eval --model snapeval --tasks
    snapeval_ruler_niah_single`` from a folder that is no checkout: no ``--include_path``."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    purelib = Path(in_venv(python, "import sysconfig; print(sysconfig.get_path('purelib'))", tmp_path))
    # this environment's packages (torch, lm-eval, ...) on its path, not its .pth files: not the
    # checkout's editable install, nor its start-up hook
    (purelib / "_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q"]
    subprocess.run([*pip, built_wheel(tmp_path)], check=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [
            python,
            "-m",
            "lm_eval",
            "--model",
            "snapeval",
            "--model_args",
            f"pretrained={tiny_llama_folder},method=snapstream,budget=96,window=16,kernel=5",
            "--tasks",
            "snapeval_ruler_niah_single",
            "--metadata",
            '{"context_length": 256}',
            "--limit",
            "2",
            "--output_path",
            "out",
        ],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [results_file] = (elsewhere / "out").rglob("results_*.json")
    results = json.loads(results_file.read_text())
    assert 0.0 <= results["results"]["snapeval_ruler_niah_single"]["score,none"] <= 1.0
    tasks_dir = in_venv(python, "import snapeval.paths as p; print(p.LM_EVAL_TASKS_DIR)", elsewhere)
    assert tasks_dir == str(purelib / "snapeval" / "lm_eval_tasks")  # the wheel's, not the checkout's


def test_in_a_fresh_interpreter_lm_evals_task_manager_takes_in_snapevals_tasks(tmp_path):
    """Once ``lm_eval.tasks`` loads, its ``TaskManager``, the one lm-eval's commands and
    ``simple_evaluate`` build, indexes snapeval's tasks too (on lm-eval's own, lm-eval's first)."""
    out = fresh_python(
        "import lm_eval.tasks, lm_eval.evaluator\n"
        "manager = lm_eval.tasks.TaskManager\n"
        "print(manager is lm_eval.evaluator.TaskManager, manager.__init__.takes_in_snapeval)\n",
        tmp_path,
    )
    assert out == "True True"


class Recorder:
    """A stand-in of lm-eval's ``TaskManager`` that records the folders it is handed (indexing lm-eval's
    thousands of tasks takes half a minute)."""

    def __init__(self, verbosity=None, include_path=None, include_defaults=True, metadata=None):
        self.handed = (include_path, include_defaults)


def test_snapevals_tasks_go_first_once_and_only_beside_lm_evals_own():
    """Snapeval's folder first, so that a folder the user names overrides its tasks; once, however the
    user spells it; none when lm-eval's own defaults are off."""
    ours = str(LM_EVAL_TASKS_DIR.resolve())
    spelled = LM_EVAL_TASKS_DIR / ".." / LM_EVAL_TASKS_DIR.name
    assert with_snapeval_tasks(None) == [ours]
    assert with_snapeval_tasks(["a", str(spelled), Path("b")]) == [ours, "a", Path("b")]
    take_in_tasks(Recorder)
    take_in_tasks(Recorder)  # once
    assert Recorder().handed == ([ours], True)
    assert Recorder(include_path="mine").handed == ([ours, "mine"], True)
    assert Recorder(None, "mine", False).handed == ("mine", False)


def test_start_up_hook_imports_nothing_heavy(tmp_path):
    out = fresh_python(
        "import sys\n"
        "from snapeval.commands.lm_eval_plugin import LmEvalFinder\n"
        "modules = ('torch', 'lm_eval', 'snapeval.commands.lm_eval_model')\n"
        "print(sorted(m for m in modules if m in sys.modules),\n"
        "      sum(isinstance(f, LmEvalFinder) for f in sys.meta_path))",
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
