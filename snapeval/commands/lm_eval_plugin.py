"""``lm_eval --model snapeval --tasks snapeval_<task>``: puts snapeval's model into lm-eval's model
registry and snapeval's task definitions into its task index.

lm-eval (0.4.x) looks a ``--model`` up in its own registry only, which it fills when ``lm_eval.models``
is imported, and a ``--tasks`` name in its own ``lm_eval/tasks/`` and ``--include_path``; it has no entry
point for models or tasks from other packages. So the wheel installs ``snapeval_lm_eval.pth`` next to
the package, and the interpreter runs :func:`install` at start-up. That adds a finder to
``sys.meta_path`` which ignores every import but those of :data:`WATCHED`: once ``lm_eval.models`` has
run, :func:`register` adds the model to the registry under ``snapeval`` (it serves every method) and
``snapstream`` (an alias), as lazy placeholders where lm-eval supports them, so torch and the model's
module load only when lm-eval asks for the model; once ``lm_eval.tasks`` has run,
:func:`register_tasks` has its task index take in snapeval's tasks (:mod:`.lm_eval_tasks`), so
``--include_path`` is not needed.

Start-up cost when lm-eval is not used: importing this module (standard library only).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType, TracebackType

MODEL_NAMES = ("snapeval", "snapstream")  # the name, and an alias
MODEL_TARGET = "snapeval.commands.lm_eval_model:SnapStreamLM"


def register() -> None:
    """Add the model to lm-eval's model registry under :data:`MODEL_NAMES` (idempotent), and have a bad
    model argument end in one line (:func:`one_line_errors`)."""
    one_line_errors()
    try:
        from lm_eval.api.registry import model_registry
    except ImportError:  # lm-eval without lazy placeholders: registering means importing the model
        import snapeval.commands.lm_eval_model  # noqa: F401

        return
    for name in MODEL_NAMES:
        if name not in model_registry:
            model_registry.register(name, target=MODEL_TARGET)


def one_line_errors() -> None:
    """Once lm-eval is in use, an uncaught :class:`~snapeval.errors.SnapevalError` (a bad ``--model_args``
    value, data that cannot be read, a bypassed engine) prints ``error: <message>`` in one line and exits
    with code 2, as snapeval's own commands do, not lm-eval's traceback around it; any other exception
    goes to the previous hook (idempotent)."""
    previous = sys.excepthook
    if getattr(previous, "snapeval_one_line", False):
        return

    def hook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
        from snapeval.cli import EXIT_BAD_INPUT, error_line  # standard library only
        from snapeval.errors import SnapevalError

        if isinstance(error, SnapevalError):
            print(error_line(error), file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_BAD_INPUT)  # bad input's exit code, as snapeval's own commands (an excepthook
            # cannot set it otherwise: the interpreter exits 1 after any uncaught exception)
        else:
            previous(kind, error, traceback)

    hook.snapeval_one_line = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def register_tasks() -> None:
    """Have lm-eval's task index take in snapeval's task definitions (:mod:`.lm_eval_tasks`; idempotent)."""
    from snapeval.commands.lm_eval_tasks import take_in_tasks

    take_in_tasks(sys.modules["lm_eval.tasks"].TaskManager)


WATCHED: dict[str, Callable[[], None]] = {"lm_eval.models": register, "lm_eval.tasks": register_tasks}
"""The modules of lm-eval the hook waits for, each with what runs once it has loaded."""


class _RegisterAfterLoading(importlib.abc.Loader):
    """Runs the wrapped loader, then ``then`` (what :data:`WATCHED` runs for the module)."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], None]) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.then()

    def __getattr__(self, name: str):  # get_source, get_resource_reader, ... of the wrapped loader
        return getattr(self.loader, name)


class LmEvalFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`WATCHED` through the other finders and wraps their loaders; ignores
    every other name."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in WATCHED:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find_spec(fullname, path, target) if find_spec else None
            if spec is not None and spec.loader is not None:
                spec.loader = _RegisterAfterLoading(spec.loader, WATCHED[fullname])
                return spec
        return None


def install() -> None:
    """Watch for lm-eval's models and tasks (from the ``.pth`` file); registers at once what is loaded
    already."""
    for name, then in WATCHED.items():
        if name in sys.modules:
            then()
    if set(WATCHED) - set(sys.modules) and not any(isinstance(f, LmEvalFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, LmEvalFinder())
