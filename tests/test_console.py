"""``snapeval SUBCOMMAND``: one front door whose subcommands are the ``python -m`` entry points."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from snapeval.commands.console import SUBCOMMANDS, main


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    printed = capsys.readouterr().out
    for name in ("run", "search", "report", "gate", "memory", "results", "figures"):
        assert f"  {name} " in printed
    assert set(SUBCOMMANDS) >= {"run", "search", "report", "gate", "memory", "results", "figures"}


def test_an_unknown_subcommand_is_one_line_and_exit_2(capsys):
    assert main(["evaluate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 'evaluate' is not a subcommand: run, search,") and err.count("\n") == 1


@pytest.mark.parametrize("name", ["report", "gate", "results", "figures", "memory"])
def test_a_subcommand_runs_its_module_as_main(name, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's --help exits 0 itself
        raise SystemExit(main([name, "--help"]))
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_a_subcommands_refusal_keeps_its_exit_code(tmp_path, capsys):
    missing = tmp_path / "none.sqlite"
    assert main(["results", "summary", "--db", str(missing)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_the_installed_console_script_is_the_front_door():
    script = shutil.which("snapeval")
    if script is None:
        pytest.skip("the snapeval console script is not installed (pip install -e . installs it)")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "subcommands:" in result.stdout


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # the gate's module, run again
def test_gate_help_names_the_front_door(capsys):
    with pytest.raises(SystemExit) as exit_:
        raise SystemExit(main(["gate", "--help"]))
    printed = capsys.readouterr().out
    assert exit_.value.code == 0 and printed.startswith("usage: snapeval gate ")
    assert "python -m" not in printed and "Accuracy gates: ``snapeval gate --spec" in printed


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # snapeval.__main__, run again
def test_run_help_lists_the_options_a_run_picks_only(capsys):
    """Not the schemas the files of a group extend (model_schema, ruler_schema, ...), nor the gate specs
    of conf/gates/ (read by snapeval gate --spec), as if they were options."""
    assert main(["run", "--help"]) == 0
    printed = capsys.readouterr().out
    groups = printed.split("== Configuration groups ==")[1].split("== Config ==")[0]
    listed = dict(line.split(": ", 1) for line in groups.splitlines() if ": " in line)
    assert set(listed) == {"cache", "exp", "hardware", "memory", "model", "protocol", "task"}
    assert "_schema" not in groups and "gates" not in groups
    assert listed["task"].startswith("aime24, livecodebench, longbench_v2,")
    assert "smollm2-135m" in listed["model"].split(", ")
    assert printed.startswith("snapeval run: evaluate a model and KV cache on a task")
