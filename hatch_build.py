"""Wheel contents beyond the package: the lm-eval start-up hook, and the configs and task definitions.

A regular wheel carries ``conf/`` and ``tasks/`` inside the package (``snapeval/conf``,
``snapeval/lm_eval_tasks``, a name apart from the task modules' ``snapeval/tasks``; see
``snapeval/paths.py``), so ``pip install snapeval`` runs without a checkout. An editable wheel carries
only the ``.pth`` hook: the checkout's own folders are used.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

LM_EVAL_HOOK = {"snapeval/commands/lm_eval_plugin.pth": "snapeval_lm_eval.pth"}
DECLARATIVE_DIRS = {"conf": "snapeval/conf", "tasks": "snapeval/lm_eval_tasks"}


class SnapevalBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            build_data["force_include_editable"] = dict(LM_EVAL_HOOK)
        else:
            build_data["force_include"].update(LM_EVAL_HOOK | DECLARATIVE_DIRS)
