"""The package's structure: no import cycles, an engine (``snapeval.cache``) that stands alone, and no
module over 350 lines (one concept per module: a longer one is split by concept, not excused).

Each check is a function over plain data, tested once on a made-up case it must reject, so that a check
which could never fail shows up as a failing test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import snapeval

PACKAGE = Path(snapeval.__file__).parent
ROOT = PACKAGE.parent
MAX_LINES = 350

#: Modules allowed over :data:`MAX_LINES`, each with the reason no concept split fits. Keep it empty.
LONG_MODULES: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def snapeval_imports(path: Path) -> set[str]:
    """Every snapeval module or name ``path`` imports, at any level (``TYPE_CHECKING`` blocks included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: relative import"
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == "snapeval"}


def import_graph() -> dict[str, set[str]]:
    """Module -> the snapeval modules it imports."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {
        name: {imported for imported in snapeval_imports(path) if imported in modules and imported != name}
        for name, path in modules.items()
    }


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (``[a, b, ..., a]``), or None when it has none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for imported in sorted(graph.get(module, ())):
            cycle = visit(imported, [*path, module])
            if cycle:
                return cycle
        done.add(module)
        return None

    return next((cycle for module in sorted(graph) if (cycle := visit(module, []))), None)


def line_counts(roots: Iterable[Path]) -> dict[str, int]:
    """Lines of every Python file under ``roots``, by path relative to the checkout."""
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for root in roots
        for path in sorted(root.rglob("*.py"))
    }


def too_long(lines: Mapping[str, int], allowed: Mapping[str, str]) -> dict[str, int]:
    """The modules over :data:`MAX_LINES` lines that ``allowed`` does not name."""
    return {name: count for name, count in lines.items() if count > MAX_LINES and name not in allowed}


def test_the_cycle_check_finds_a_cycle_through_a_package():
    graph = {
        "snapeval.a": {"snapeval.b"},
        "snapeval.b": {"snapeval.c"},
        "snapeval.c": {"snapeval.a"},
        "x": set(),
    }
    assert find_cycle(graph) == ["snapeval.a", "snapeval.b", "snapeval.c", "snapeval.a"]
    assert find_cycle({"snapeval.a": {"snapeval.b"}, "snapeval.b": set()}) is None


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert len(graph) >= 60  # the whole package was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


#: What the engine (``snapeval.cache``) may import of snapeval besides itself: it knows no tasks, runs or
#: results.
ENGINE_DEPENDENCIES = {
    "snapeval.errors": "the one error type",
    "snapeval.configs.cache": "each method's declaration: torch-free dataclasses, defaults and checks",
    "snapeval.configs.methods": "the methods by name, and what results store of their parameters",
    "snapeval.configs.setting": "one cache setting, checked and resolved once: what the engine is built from",
    "snapeval.configs.footprint": "what a row holds: slots per layer and bytes per slot, torch-free",
    "snapeval.couplings": "the transformers conventions it relies on, the tested versions, the bypass error",
}


def test_the_engine_imports_nothing_of_snapeval_but_itself_its_parameters_and_errors() -> None:
    graph = import_graph()
    engine = {name: imports for name, imports in graph.items() if name.startswith("snapeval.cache")}
    assert len(engine) >= 8
    outside = {
        name: sorted(
            m for m in imports if not m.startswith("snapeval.cache") and m not in ENGINE_DEPENDENCIES
        )
        for name, imports in engine.items()
    }
    assert not any(outside.values()), outside


def test_the_size_check_rejects_a_long_module_whatever_its_docstring_says(tmp_path):
    module = tmp_path / "long.py"
    module.write_text('"""Longer than 350 lines: a reason."""\n' + "x = 1\n" * MAX_LINES)
    lines = {"long.py": len(module.read_text().splitlines()), "short.py": MAX_LINES}
    assert too_long(lines, {}) == {"long.py": MAX_LINES + 1}
    assert too_long(lines, {"long.py": "a reason"}) == {}


def test_no_module_is_over_350_lines() -> None:
    """The package, the lm-eval task glue (``tasks/``) and the benchmark scripts; an allowed module that
    has become short leaves the allow-list."""
    lines = line_counts([PACKAGE, ROOT / "tasks", ROOT / "benchmarks"])
    assert "snapeval/run/runner.py" in lines and "tasks/utils.py" in lines
    assert too_long(lines, LONG_MODULES) == {}
    assert [name for name in LONG_MODULES if lines.get(name, 0) <= MAX_LINES] == []


#: The rooms of the package, floor by floor: a room imports only rooms on lower floors (docs/layout.md).
#: ``snapeval`` is the package's ``__init__`` (``snapeval.evaluate``); ``__main__`` is ``python -m snapeval``.
FLOORS: tuple[frozenset[str], ...] = tuple(
    frozenset(floor.split())
    for floor in (
        "errors paths stats",
        "cli configs couplings sandbox",
        "cache results",
        "figures memory models",
        "decode",
        "tasks backends",
        "run",
        "commands",
        "__main__ report snapeval",
    )
)
ROOT_MODULES = 6  # at most, beside the rooms


def room_of(module: str) -> str:
    """``snapeval.run.plan`` -> ``run``; a module at the root is its own room."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: Mapping[str, Iterable[str]], floors: tuple[frozenset[str], ...]) -> list[str]:
    """Every import of a room on the same floor or a higher one (a room's own modules aside), and every
    room that no floor names."""
    floor_of = {room: index for index, floor in enumerate(floors) for room in floor}
    found = []
    for module, imports in graph.items():
        here = room_of(module)
        if here not in floor_of:
            found.append(f"{module}: room {here} is on no floor")
            continue
        for imported in imports:
            there = room_of(imported)
            if there != here and floor_of.get(there, len(floors)) >= floor_of[here]:
                found.append(f"{module} -> {imported}")
    return sorted(found)


def test_the_floor_check_finds_an_upward_import():
    floors = (frozenset({"errors"}), frozenset({"cache"}), frozenset({"run"}))
    graph = {
        "snapeval.cache.a": {"snapeval.run.plan", "snapeval.errors"},
        "snapeval.run.plan": {"snapeval.cache.a"},
    }
    assert upward_imports(graph, floors) == ["snapeval.cache.a -> snapeval.run.plan"]
    assert upward_imports({"snapeval.new.x": set()}, floors) == ["snapeval.new.x: room new is on no floor"]


def test_every_room_imports_only_rooms_below_it() -> None:
    assert upward_imports(import_graph(), FLOORS) == []


def test_the_package_root_holds_few_modules_and_every_other_sits_in_a_room() -> None:
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= ROOT_MODULES, root
    assert {"__init__.py", "__main__.py", "errors.py"} <= set(root)
