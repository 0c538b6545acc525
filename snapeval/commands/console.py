"""``snapeval SUBCOMMAND [ARGS]``: one front door for every command, each of them still a ``python -m``
entry point (the subcommand runs that module as ``__main__``, with the rest of the arguments)."""

from __future__ import annotations

import runpy
import sys

#: subcommand -> (the module it runs, the arguments put before the user's, what it does)
SUBCOMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "run": ("snapeval", (), "evaluate a model and cache on a task (Hydra overrides; -m for a sweep)"),
    "search": ("snapeval", ("+exp=budget_search",), "the smallest budget that keeps a target (search.*)"),
    "report": ("snapeval.report", (), "the decision report of a database (HTML or Markdown)"),
    "gate": ("snapeval.commands.gate", (), "accuracy gates: exit 1 when compression costs too much accuracy"),
    "memory": ("snapeval.memory", (), "KV and weight memory of a model, method and accelerator"),
    "results": ("snapeval.results", (), "the results database: summary, export, migrate"),
    "figures": ("snapeval.figures", (), "the figures of a database"),
    "couplings": ("snapeval.couplings", (), "the transformers versions the engine was tested with"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in SUBCOMMANDS.items()]
    return "\n".join(
        [
            "usage: snapeval SUBCOMMAND [ARGS]   (snapeval SUBCOMMAND --help: its own arguments)",
            "",
            "subcommands:",
            *lines,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand named first in ``argv`` (``sys.argv[1:]``); 2 for an unknown one."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"error: {name!r} is not a subcommand: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    module, before, _ = SUBCOMMANDS[name]
    sys.argv = [f"snapeval {name}", *before, *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
