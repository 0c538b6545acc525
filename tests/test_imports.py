"""The package's import structure: no cycles, and an engine (``snapeval.cache``) that stands alone."""

from __future__ import annotations

import ast
from pathlib import Path

import snapeval

PACKAGE = Path(snapeval.__file__).parent


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


def test_no_import_cycles() -> None:
    graph = import_graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module) :] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_engine_imports_nothing_of_snapeval_but_itself_and_errors() -> None:
    graph = import_graph()
    engine = {name: imports for name, imports in graph.items() if name.startswith("snapeval.cache")}
    assert len(engine) >= 8
    outside = {
        name: sorted(m for m in imports if not m.startswith("snapeval.cache") and m != "snapeval.errors")
        for name, imports in engine.items()
    }
    assert not any(outside.values()), outside


def test_long_modules_say_why() -> None:
    """A module over 350 lines states its reason in its docstring (``Longer than 350 lines: ...``)."""
    for root in (PACKAGE, PACKAGE.parent / "benchmarks"):
        for path in root.rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if text.count("\n") > 350:
                assert "Longer than 350 lines:" in (ast.get_docstring(ast.parse(text)) or ""), path
