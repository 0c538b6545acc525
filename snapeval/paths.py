"""Where the project's declarative parts live: Hydra configs and lm-eval task definitions."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"
TASKS_DIR = REPO_ROOT / "tasks"
