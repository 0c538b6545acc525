"""Prose that cannot drift: every cross-reference in the package's docstrings and comments
(``:func:`snapeval.run.runner.execute```, ``:mod:``, ``:class:``, ...) names something that exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import snapeval

PACKAGE = Path(snapeval.__file__).parent
REFERENCE = re.compile(r":(?:func|mod|class|meth|data|attr|exc):`~?(snapeval(?:\.\w+)+)`")


def resolves(reference: str) -> bool:
    """Whether dotted ``reference`` is a module of the package or an attribute reached from one."""
    parts = reference.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_every_docstring_reference_names_something_that_exists():
    references = {
        (match.group(1), str(path.relative_to(PACKAGE.parent)))
        for path in PACKAGE.rglob("*.py")
        for match in REFERENCE.finditer(path.read_text(encoding="utf-8"))
    }
    assert len(references) > 200
    stale = sorted((where, reference) for reference, where in references if not resolves(reference))
    assert not stale, stale


def test_a_stale_reference_is_caught():
    assert resolves("snapeval.run.runner.execute") and resolves("snapeval.cache")
    assert not resolves("snapeval.configs.methods.no_such_function")
    assert not resolves("snapeval.no_such_room.module")
