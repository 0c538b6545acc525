"""Each option list of the tasks is written once, in the light schema modules, and everything else reads
it: the scorers, prompt builders and task options are found by name, and importing the schemas loads no
heavy library."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import snapeval
from snapeval.configs.fields import PROMPT_STYLES
from snapeval.configs.task import AIME_SCORERS, ANSWER_FROM, CODE_EXTRACTIONS, task_options

PACKAGE = Path(snapeval.__file__).parent
OPTION_LISTS = {
    "AIME_SCORERS": (AIME_SCORERS, "configs/task.py"),
    "ANSWER_FROM": (ANSWER_FROM, "configs/task.py"),
    "CODE_EXTRACTIONS": (CODE_EXTRACTIONS, "configs/task.py"),
    "PROMPT_STYLES": (PROMPT_STYLES, "configs/fields.py"),
}


def literal_strings(node: ast.AST) -> set[str]:
    """The strings a literal tuple, list, set or dict (its keys), or a call's arguments, spell out."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [key for key in node.keys if key is not None]
    elif isinstance(node, ast.Call):
        items = node.args
    else:
        return set()
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def definitions(values: tuple[str, ...], root: Path = PACKAGE) -> Iterator[str]:
    """``file:line`` of each literal under ``root`` that spells out all of ``values``."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if set(values) <= literal_strings(node):
                yield f"{path.relative_to(root)}:{node.lineno}"


@pytest.mark.parametrize("name", OPTION_LISTS)
def test_each_option_list_is_defined_once(name: str) -> None:
    values, home = OPTION_LISTS[name]
    found = list(definitions(values))
    assert len(found) == 1 and found[0].startswith(f"{home}:"), found


def test_a_second_copy_is_found(tmp_path: Path) -> None:
    (tmp_path / "home.py").write_text(f"KINDS = {CODE_EXTRACTIONS!r}\n")
    (tmp_path / "copy.py").write_text(f"check = choice({', '.join(map(repr, CODE_EXTRACTIONS))})\n")
    assert list(definitions(CODE_EXTRACTIONS, tmp_path)) == ["copy.py:1", "home.py:1"]


def test_the_implementations_are_found_by_the_declared_names() -> None:
    from snapeval.tasks.aime_scorers import SCORERS
    from snapeval.tasks.livecodebench.prompts import STYLES

    assert tuple(SCORERS) == AIME_SCORERS and tuple(STYLES) == PROMPT_STYLES
    assert task_options("aime24") == task_options("longbench_v2_cot") == {"answer_from": ANSWER_FROM}
    assert task_options("livecodebench") == {"code_extraction": CODE_EXTRACTIONS}


def test_the_schemas_import_no_heavy_library() -> None:
    heavy = ("torch", "transformers", "sympy", "math_verify", "lm_eval", "datasets")
    probe = f"import sys, snapeval.configs.task; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr
