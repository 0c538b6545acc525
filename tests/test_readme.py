"""Every ``python -m snapeval ...`` command in the README composes into valid configs (docs never rot)."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from snapeval.paths import CONF_DIR

from .conftest import composed_sweep

README = CONF_DIR.parent / "README.md"
COMMAND = re.compile(r"^(?:\w+=\S+ )*python -m snapeval (.+?)(?:\s+#.*)?$", re.MULTILINE)


def readme_commands() -> list[str]:
    return COMMAND.findall(README.read_text())


def test_the_readme_shows_evaluation_commands():
    assert len(readme_commands()) >= 10


GROUP_NAMES = {"task": "name", "model": "name", "cache": "method", "protocol": "name", "hardware": "name"}


def configured(config: dict, override: str) -> bool:
    """Whether ``config`` holds what ``override`` (``key=value``, ``group=option``, ``+group=option``)
    asks for; a multirun list (``a,b``) holds if any of its values does."""
    key, _, value = override.lstrip("+").partition("=")
    path = key.split(".")
    if len(path) == 1 and path[0] in GROUP_NAMES:
        path = [path[0], GROUP_NAMES[path[0]]]
    for part in path:
        if not isinstance(config, dict) or part not in config:
            return False
        config = config[part]
    return any(str(config) == choice or config == yaml.safe_load(choice) for choice in value.split(","))


@pytest.mark.parametrize("arguments", readme_commands())
def test_readme_command_composes_to_what_it_says(arguments):
    overrides = [o for o in shlex.split(arguments) if o != "-m"]  # -m: multirun; the points compose alike
    experiment = next((o.split("=", 1)[1] for o in overrides if o.startswith("+exp=")), None)
    rest = [o for o in overrides if not o.startswith("+exp=")]
    points = composed_sweep(experiment, *rest)
    assert points
    gridded = len({yaml.safe_dump(point["cache"]) for point in points}) > 1
    for override in rest:
        if override.startswith("grid.") or (gridded and override.startswith("cache")):
            continue  # a grid's points set the cache themselves
        if override.startswith("hydra"):
            continue  # Hydra's own settings (a launcher): composing them is the check
        assert any(configured(point, override) for point in points), override


TRACE_ITEM = re.compile(r"^\d+\. `([^`]+)`:", re.MULTILINE)


def test_the_readme_traces_a_sweep_through_at_most_12_files_that_exist():
    """The layout section's trace from config to figure names real files, the task module that serves
    aime24 among them, and no more than 12 of them."""
    from snapeval.tasks import task_class

    section = README.read_text().split("## Layout", 1)[1]
    files = TRACE_ITEM.findall(section)
    assert 9 <= len(files) <= 12, files
    root = CONF_DIR.parent
    assert all((root / name).is_file() for name in files), [n for n in files if not (root / n).is_file()]
    serving = task_class("aime24").__module__.replace(".", "/") + ".py"
    assert serving in files
    assert "conf/exp/aime_budget_sweep.yaml" in files
