"""Where the project's declarative parts live: Hydra configs and lm-eval task definitions.

In a checkout (and an editable install) they are the top-level ``conf/`` and ``tasks/``. A wheel carries
them inside the package (see ``hatch_build.py``): ``snapeval/conf`` and ``snapeval/lm_eval_tasks``, the
latter named apart from the Python package ``snapeval/tasks`` (the task modules).
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _declarative_dir(in_checkout: str, in_package: str) -> Path:
    """``snapeval/<in_package>`` where a wheel put it, else the checkout's ``<in_checkout>/``."""
    packaged = PACKAGE_DIR / in_package
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / in_checkout


CONF_DIR = _declarative_dir("conf", in_package="conf")
LM_EVAL_TASKS_DIR = _declarative_dir("tasks", in_package="lm_eval_tasks")
