"""Every ``python -m snapeval ...`` command in the README composes into valid configs (docs never rot)."""

from __future__ import annotations

import re
import shlex

import pytest

from snapeval.paths import CONF_DIR

from .conftest import composed_sweep

README = CONF_DIR.parent / "README.md"
COMMAND = re.compile(r"^(?:\w+=\S+ )*python -m snapeval (.+?)(?:\s+#.*)?$", re.MULTILINE)


def readme_commands() -> list[str]:
    return COMMAND.findall(README.read_text())


def test_the_readme_shows_evaluation_commands():
    assert len(readme_commands()) >= 10


@pytest.mark.parametrize("arguments", readme_commands())
def test_readme_command_composes_and_validates(arguments):
    overrides = [o for o in shlex.split(arguments) if o != "-m"]  # -m: multirun; the points compose alike
    experiment = next((o.split("=", 1)[1] for o in overrides if o.startswith("+exp=")), None)
    assert composed_sweep(experiment, *(o for o in overrides if not o.startswith("+exp=")))
