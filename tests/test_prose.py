"""Prose that cannot drift: every cross-reference in the package's docstrings and comments
(``:func:`snapeval.run.runner.execute```, ``:mod:`.sampling```, ``:class:``, ...) names something that
exists, and so does every repository path they name; a package's list of its modules is whole; the
docstrings of the engine's seams name what the code passes through them; and no page says there are no GPU
numbers where it quotes some."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import typing
from pathlib import Path

import snapeval

PACKAGE = Path(snapeval.__file__).parent
REFERENCE = re.compile(r":(?:func|mod|class|meth|data|attr|exc):`~?(snapeval(?:\.\w+)+)`")
RELATIVE = re.compile(r":(?:func|mod|class|meth|data|attr|exc):`~?(\.\w+(?:\.\w+)*)`")
"""A reference relative to the package of the module it is in (``:mod:`.sampling```)."""


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


def package_of(path: Path) -> str:
    """The dotted package a source file of the package is in (an ``__init__.py``: its own)."""
    return ".".join(path.parent.relative_to(PACKAGE.parent).parts)


def test_every_docstring_reference_names_something_that_exists():
    references = {
        (match.group(1), str(path.relative_to(PACKAGE.parent)))
        for path in PACKAGE.rglob("*.py")
        for match in REFERENCE.finditer(path.read_text(encoding="utf-8"))
    } | {
        (package_of(path) + match.group(1), str(path.relative_to(PACKAGE.parent)))
        for path in PACKAGE.rglob("*.py")
        for match in RELATIVE.finditer(path.read_text(encoding="utf-8"))
    }
    assert len(references) > 200
    stale = sorted((where, reference) for reference, where in references if not resolves(reference))
    assert not stale, stale


def test_a_stale_reference_is_caught():
    assert resolves("snapeval.run.runner.execute") and resolves("snapeval.cache")
    assert RELATIVE.findall("(:mod:`.batch_rows`)") == [".batch_rows"]
    assert resolves(package_of(PACKAGE / "decode" / "__init__.py") + ".batch_rows")
    assert not resolves(package_of(PACKAGE / "decode" / "generation.py") + ".rows")
    assert not resolves("snapeval.configs.methods.no_such_function")
    assert not resolves("snapeval.no_such_room.module")


ROOT = PACKAGE.parent
NAMED_PATH = re.compile(
    r"(?<![\w/.\-~])((?:snapeval|tests|docs|benchmarks|conf|scripts|notebooks|tasks)/(?:[\w./\-]|<\w+>)*[\w>])"
)
WHEEL_ONLY = set(
    ast.literal_eval(
        re.search(r"DECLARATIVE_DIRS = (\{.*\})", (ROOT / "hatch_build.py").read_text()).group(1)
    ).values()
)
"""The folders only a built wheel has (``conf/`` and ``tasks/`` inside the package, hatch_build.py)."""


def path_exists(named: str) -> bool:
    """Whether repository path ``named`` exists; ``<kind>`` in it stands for any name."""
    return any(ROOT.glob(re.sub(r"<\w+>", "*", named)))


def test_every_repository_path_the_package_names_exists():
    """Docstrings and comments name files and folders (``tests/data/aime_probes.json``,
    ``conf/task/ruler_<kind>.yaml``): each is there."""
    named = {
        (match.group(1), str(path.relative_to(ROOT)))
        for path in PACKAGE.rglob("*.py")
        for match in NAMED_PATH.finditer(path.read_text(encoding="utf-8"))
    }
    assert len(named) > 50
    missing = sorted(
        (where, path) for path, where in named if path not in WHEEL_ONLY and not path_exists(path)
    )
    assert not missing, missing


def test_a_stale_path_is_caught():
    assert NAMED_PATH.findall("``tests/data/aime_probes.jsonl`` holds") == ["tests/data/aime_probes.jsonl"]
    assert not path_exists("tests/data/aime_probes.jsonl")
    assert path_exists("tests/data/aime_probes.json") and path_exists("conf/task/ruler_<kind>.yaml")


def module_listing(init: Path) -> tuple[set[str], set[str]] | None:
    """The modules a package's docstring lists (its ``Modules:`` paragraph) and the modules it has
    (``__main__`` aside); None for a package whose docstring lists none."""
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    if "Modules:" not in doc:
        return None
    package = ".".join(init.parent.relative_to(ROOT).parts)
    paragraph = doc.split("Modules:", 1)[1].split("\n\n", 1)[0]
    listed = {name for name in re.findall(rf":mod:`~?{re.escape(package)}\.(\w+)`", paragraph)}
    modules = {path.stem for path in init.parent.glob("*.py") if path.stem not in ("__init__", "__main__")}
    return listed, modules | {path.parent.name for path in init.parent.glob("*/__init__.py")}


def test_a_package_that_lists_its_modules_lists_them_all():
    listings = {
        str(init.relative_to(ROOT)): listing
        for init in PACKAGE.rglob("__init__.py")
        if (listing := module_listing(init)) is not None
    }
    assert {"snapeval/decode/__init__.py", "snapeval/decode/continuous/__init__.py"} <= listings.keys()
    unlisted = {where: sorted(modules - listed) for where, (listed, modules) in listings.items()}
    assert not any(unlisted.values()), unlisted


def test_the_seams_docstrings_name_what_the_code_passes():
    """The attention's docstring names the cache interface it drives and each of its implementations; the
    batcher's package names the class its decode step runs the rows in; a cache setting's docstring names
    each of its fields."""
    from snapeval.cache import attention
    from snapeval.cache.attended import AttendedCache
    from snapeval.configs.setting import CacheSetting
    from snapeval.decode import continuous

    kinds = [AttendedCache, *AttendedCache.__subclasses__()]  # the rows' class: imported with the batcher
    owners = {f"{kind.__module__}.{kind.__name__}" for kind in kinds}
    assert len(owners) >= 3
    unnamed = sorted(owner for owner in owners if f":class:`~{owner}`" not in attention.__doc__)
    assert not unnamed, f"snapeval/cache/attention.py does not name {unnamed}"
    rows = typing.get_type_hints(continuous.ContinuousBatcher.step)["slots"]
    assert f":class:`~{rows.__module__}.{rows.__name__}`" in continuous.__doc__
    assert all(f"``{field.name}``" in CacheSetting.__doc__ for field in dataclasses.fields(CacheSetting))


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
NO_GPU_NUMBERS = re.compile(r"\bno GPU (?:timings|numbers|measurements)\b", re.IGNORECASE)
GPU = re.compile(r"\b(?:A100|H100|H200|B200|MI300X?)\b")
MEASURED = re.compile(r"\d\s*(?:ms|s|tok/s|GB/s)\b|\bmeasur", re.IGNORECASE)


def gpu_claims(text: str) -> list[tuple[bool, bool]]:
    """Per part of a page (its introduction, then each ``##`` section): whether it says there are no GPU
    numbers, and whether a sentence of it quotes a measurement on a named GPU. What the introduction says
    holds for the whole page."""
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    measured = [
        any(GPU.search(s) and MEASURED.search(s) for s in re.split(r"\.\s+", " ".join(part.split())))
        for part in parts
    ]
    denied = [bool(NO_GPU_NUMBERS.search(part)) for part in parts]
    return [(denied[0], any(measured)), *zip(denied[1:], measured[1:], strict=True)]


def test_no_page_says_there_are_no_gpu_numbers_where_it_quotes_some():
    claims = {str(page.relative_to(ROOT)): gpu_claims(page.read_text(encoding="utf-8")) for page in PAGES}
    contradicted = sorted(page for page, parts in claims.items() if any(all(part) for part in parts))
    assert not contradicted, contradicted


def test_a_page_denying_the_gpu_numbers_it_quotes_is_caught():
    intro = (
        "# Speed\n\nThere are no GPU timings.\n\n## Steps\n\n5.5 of 12.8 ms of a compiled step on an H200.\n"
    )
    assert (True, True) in gpu_claims(intro)
    section = "# Memory\n\n## Load\n\nNo GPU numbers yet.\n\n## GPU\n\nAn H200 measured 12.8 ms per step.\n"
    assert (True, True) not in gpu_claims(section)  # each section speaks for itself
