"""Every symbol of transformers, lm-eval and kvpress that snapeval leans on (snapeval/couplings.py) still
exists in the installed versions, which are inside the tested range that pyproject.toml pins; a symbol
that moved is named in one line with the installed version and the range."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from snapeval import couplings
from snapeval.couplings import COUPLINGS, TESTED, Coupling, installed_version, resolve
from snapeval.errors import SnapevalError

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.mark.parametrize("coupling", COUPLINGS, ids=lambda coupling: coupling.name)
def test_each_coupling_resolves_in_the_installed_version(coupling: Coupling):
    if reason := coupling.unused_because():
        pytest.skip(reason)
    assert resolve(coupling) is not None


@pytest.mark.parametrize(
    ("version", "since", "reason"),
    [
        (None, "", "kvpress is not installed (supported: {low}-{high})"),
        ("0.5.5", "", ""),
        ("0.5.5", "0.6.0", "kvpress 0.5.5 is older than 0.6.0, the first snapeval uses kvpress.presses.P of"),
        ("0.6.0", "0.6.0", ""),
    ],
)
def test_a_skipped_coupling_names_the_versions(version, since, reason, monkeypatch):
    """The reason a coupling's test is skipped names what is installed and what snapeval uses."""
    monkeypatch.setattr(couplings, "installed_version", lambda package: version)
    coupling = Coupling("kvpress", "kvpress.presses", "P", "a press", since)
    low, high = TESTED["kvpress"]
    assert coupling.unused_because() == reason.format(low=low, high=high)
    assert coupling.applies() == (not reason)


def test_a_symbol_that_moved_is_named_in_one_line_with_the_version_and_the_range(monkeypatch):
    moved = Coupling("transformers", "transformers.masking_utils", "sdpa_mask_moved", "prefill masks")
    with pytest.raises(SnapevalError) as refused:
        resolve(moved)
    message = str(refused.value)
    version = installed_version("transformers")
    assert message.startswith(
        f"transformers: transformers {version} has no transformers.masking_utils.sdpa_mask"
    )
    assert message.endswith(f"supported: {TESTED['transformers'][0]}-{TESTED['transformers'][1]}")
    assert "\n" not in message
    monkeypatch.setattr(couplings, "COUPLINGS", (*COUPLINGS, moved))
    with pytest.raises(SnapevalError, match="sdpa_mask_moved"):
        couplings.check("transformers")


def pinned() -> dict[str, Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    listed = project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    requirements = [Requirement(line) for line in listed]
    return {re.sub(r"[-_.]+", "_", r.name): r for r in requirements}


@pytest.mark.parametrize("package", sorted(TESTED))
def test_pyproject_pins_exactly_the_tested_range(package):
    """Both ends of every coupled package's range were run; raising a ceiling is a deliberate change."""
    low, high = TESTED[package]
    specifier = pinned()[package].specifier
    expected = {f"=={low}"} if low == high else {f">={low}", f"<={high}"}
    assert {str(s) for s in specifier} == expected


@pytest.mark.parametrize("package", sorted(TESTED))
def test_the_installed_version_is_inside_the_tested_range(package):
    version = installed_version(package)
    if version is None:
        pytest.skip(f"{package} is not installed")
    low, high = TESTED[package]
    assert Version(low) <= Version(version) <= Version(high), f"{package} {version}: tested {low}-{high}"


def test_the_transformers_script_refuses_a_version_that_is_a_path_before_touching_the_disk():
    project = PYPROJECT.parent
    made = [project / ".venv-transformers-..", project.parent / "escape"]
    assert not any(path.exists() for path in made)
    done = subprocess.run(
        [project / "scripts" / "test-transformers", "../../../escape"], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("error: version: '../../../escape'") and done.stderr.count("\n") == 1
    assert not any(path.exists() for path in made)
