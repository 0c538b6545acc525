"""The benchmarks: one module each, declaring its task once (see :mod:`snapeval.tasks.base`).

=======================  =====================================  ======================================
task config (``task=``)  module                                 what it is
=======================  =====================================  ======================================
``aime24``               :mod:`snapeval.tasks.aime24`           AIME 2024, the official scorers
``longbench_v2``,        :mod:`snapeval.tasks.longbench_v2`     LongBench-v2 multiple choice (0-shot,
``longbench_v2_cot``                                            two-pass CoT)
``livecodebench``        :mod:`snapeval.tasks.livecodebench`    LiveCodeBench code generation, sandboxed
``ruler_<kind>``         :mod:`snapeval.tasks.ruler`            offline RULER-style needles in haystacks
                                                                (``*_multiturn``: one asked a turn)
``scbench``              :mod:`snapeval.tasks.scbench`          SCBench's multi-turn subsets
=======================  =====================================  ======================================

A task config ``conf/task/<name>.yaml`` is served by the module of this package whose name is ``<name>``
or its longest prefix before an underscore (``ruler_passkey`` -> ``ruler``), by the
:class:`~snapeval.tasks.base.Task` subclass there that lists ``<name>`` in its ``names``: the rule by which
it finds its schema too (:func:`snapeval.configs.task.kind_of`), whose ``module`` is that module. Adding a
benchmark is one module and one config, and a schema in :mod:`snapeval.configs.task` for settings or
options beyond a name and a length (then ``python -m snapeval.tasks.lm_eval_export`` writes its lm-eval
definition). Only the module of the task built is imported.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from snapeval.configs.task import kind_of
from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR
from snapeval.tasks.base import AnswerPass, Prompt, Task

__all__ = ["AnswerPass", "Prompt", "Task", "load_task", "task_class", "task_names"]


def task_names() -> list[str]:
    """Every task config: the names of ``conf/task/*.yaml``."""
    return sorted(path.stem for path in (CONF_DIR / "task").glob("*.yaml"))


def task_class(name: str) -> type[Task]:
    """The :class:`Task` subclass that serves the task config ``name``."""
    kind = kind_of(name, (module.name for module in pkgutil.iter_modules(__path__)))
    if kind:
        module = importlib.import_module(f"{__name__}.{kind}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Task) and name in getattr(value, "names", ()):
                return value
    raise SnapevalError(
        f"no task module in snapeval/tasks serves {name!r}; tasks: {', '.join(task_names())}", "task.name"
    )


def load_task(cfg: Mapping[str, Any], seed: int, limit: int | None = None) -> Task:
    """The task of the ``task`` config group, built from its config, serving its first ``limit`` samples
    (``run.limit``; None: all)."""
    return task_class(cfg["name"])(cfg, seed, limit)
