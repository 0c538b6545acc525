"""Where a benchmark's rows live (:class:`DataSource`), and reading them from the Hugging Face Hub
(:func:`read_hub`); local files are read by :func:`snapeval.tasks.rows.load_rows`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snapeval.errors import SnapevalError

DATA_DIR_ENV = "SNAPEVAL_DATA_DIR"
DATA_PATH_FIELD = "task.metadata.data_path"  # where a Hydra run sets the local file or folder


@dataclass(frozen=True)
class DataSource:
    """Where a benchmark's rows live: its Hub id/split, its path under the data dir, required fields."""

    name: str
    hub_id: str
    hub_split: str
    local_path: str
    required: tuple[str, ...]
    hub_config: str | None = None
    hub_data_files: tuple[str, ...] = ()  # files of the Hub dataset read as JSON lines, when given


def read_hub(source: DataSource) -> list[dict[str, Any]]:
    """Every row of ``source`` from the Hub (or the ``datasets`` cache); unreachable: one line naming
    the local alternatives."""
    import datasets

    try:
        if source.hub_data_files:
            dataset = datasets.load_dataset("json", data_files=list(source.hub_data_files), split="train")
        else:
            dataset = datasets.load_dataset(source.hub_id, source.hub_config, split=source.hub_split)
    except Exception as exc:  # the Hub client raises many types; all mean "not reachable / not found"
        raise SnapevalError(
            f"could not load {source.name} from the Hugging Face Hub ({source.hub_id}): "
            f"{type(exc).__name__}. Offline? Set ${DATA_DIR_ENV} or {DATA_PATH_FIELD} to a local copy.",
            DATA_PATH_FIELD,
        ) from None
    return [dict(row) for row in dataset]
