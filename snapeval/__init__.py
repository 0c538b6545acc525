"""snapeval: long-context accuracy evaluation for KV-cache compression.

:func:`evaluate` runs one evaluation from Python, as ``python -m snapeval`` does. Importing the package
loads nothing else: Hydra, torch and pandas load when it is called.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__version__ = "0.1.0"


def evaluate(
    model: str | None = None,
    task: str | None = None,
    cache: str | None = None,
    *,
    db: str | os.PathLike[str] | None = None,
    protocol: str | None = None,
    exp: str | None = None,
    overrides: Sequence[str] = (),
) -> pd.DataFrame:
    """Run one evaluation and return its stored samples, one row each (the columns of ``snapeval results
    export``: the run's flattened config, ``sample_id``, ``output``, ``score``, ``config_hash``, ...).

    ``model``, ``task``, ``cache``, ``protocol`` pick an option of their config group and ``exp`` an
    experiment (``+exp=``); ``db`` is ``run.db`` (a path or SQLAlchemy URL); ``overrides`` sets any other
    field, as on the command line (``["cache.budget=128", "run.limit=2"]``). The config is composed,
    checked and run exactly as ``python -m snapeval <the same overrides>`` runs it, into the same
    database rows; samples already stored for the same settings are reused. Bad input raises
    :class:`snapeval.errors.SnapevalError`, one line naming the field, before torch loads.
    """
    from snapeval.commands.evaluate import evaluate as run

    named = {"model": model, "task": task, "cache": cache, "protocol": protocol, "exp": exp, "db": db}
    return run(named, overrides)
