"""Where the project's declarative parts live: Hydra configs and lm-eval task definitions.

In a checkout (and an editable install) they are the top-level ``conf/`` and ``lm_eval_tasks/``; a wheel
carries them inside the package (see ``hatch_build.py``).
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _declarative_dir(name: str) -> Path:
    in_package = PACKAGE_DIR / name
    return in_package if in_package.is_dir() else PACKAGE_DIR.parent / name


CONF_DIR = _declarative_dir("conf")
LM_EVAL_TASKS_DIR = _declarative_dir("lm_eval_tasks")
