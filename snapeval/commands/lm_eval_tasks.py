"""``lm_eval --tasks snapeval_<task>``: lm-eval's task index with snapeval's task definitions in it.

lm-eval (0.4.x) indexes its own ``lm_eval/tasks/`` and the folders of ``--include_path`` only; it has no
entry point for tasks from other packages. So once ``lm_eval.tasks`` is imported, the start-up hook
(:mod:`snapeval.commands.lm_eval_plugin`) has its ``TaskManager`` (which every lm-eval command and
``simple_evaluate`` build) take in :data:`snapeval.paths.LM_EVAL_TASKS_DIR` (the checkout's ``tasks/``,
or the wheel's ``snapeval/lm_eval_tasks``), so the tasks are found from any folder, without
``--include_path``. Standard library only at import: lm-eval hands its class over.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from snapeval.paths import LM_EVAL_TASKS_DIR

IncludePath = str | Path | list[str | Path] | None  # lm-eval's: one folder, a list, or none


def with_snapeval_tasks(include_path: IncludePath) -> list[str | Path]:
    """``include_path`` with snapeval's task definitions first, so that a folder the user names still
    overrides them; once, however the user spells the folder."""
    paths = [include_path] if isinstance(include_path, str | Path) else include_path or []
    ours = LM_EVAL_TASKS_DIR.resolve()
    return [str(ours), *(path for path in paths if Path(path).resolve() != ours)]


def take_in_tasks(manager: type) -> None:
    """Have lm-eval's ``TaskManager`` class ``manager`` index snapeval's tasks beside lm-eval's own
    (:func:`with_snapeval_tasks`), not when ``include_defaults`` is false, which asks for the
    ``include_path`` folders alone (idempotent)."""
    indexes = manager.__init__
    if getattr(indexes, "takes_in_snapeval", False):
        return

    @functools.wraps(indexes)
    def init(
        self: Any,
        verbosity: str | None = None,
        include_path: IncludePath = None,
        include_defaults: bool = True,
        metadata: dict | None = None,
    ) -> None:
        if include_defaults:
            include_path = with_snapeval_tasks(include_path)
        indexes(self, verbosity, include_path, include_defaults, metadata)

    init.takes_in_snapeval = True  # type: ignore[attr-defined]
    manager.__init__ = init
