"""Benchmark rows from a local file or folder, ``$SNAPEVAL_DATA_DIR``, or the Hugging Face Hub.

Resolution order for a benchmark: an explicit ``data_path`` (a .jsonl/.json/.parquet file, or a folder
holding one), then ``$SNAPEVAL_DATA_DIR/<relative path>`` (laid out like the project's shared data:
``aime24/test.jsonl``, ...), then the Hub dataset id. Bad rows stop with the file and line named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapeval.errors import SnapevalError

DATA_DIR_ENV = "SNAPEVAL_DATA_DIR"
DATA_PATH_FIELD = "task.metadata.data_path"  # where a Hydra run sets the local file or folder
SUFFIXES = (".jsonl", ".json", ".parquet")


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


def load_rows(source: DataSource, data_path: str | None = None) -> list[dict[str, Any]]:
    """All rows of ``source``, checked for its required fields."""
    path = local_file(source, data_path)
    rows = _read_file(path) if path else _read_hub(source)
    where = str(path) if path else source.hub_id
    if not rows:
        raise SnapevalError(f"{where} holds no rows", DATA_PATH_FIELD)
    for index, row in enumerate(rows, start=1):
        missing = [field for field in source.required if field not in row]
        if missing:
            raise SnapevalError(
                f"{where}, row {index}: missing field(s) {', '.join(missing)}", DATA_PATH_FIELD
            )
    return rows


def local_file(source: DataSource, data_path: str | None) -> Path | None:
    """The local file rows of ``source`` are read from, or None for the Hub."""
    if data_path:
        path = Path(data_path).expanduser()
        if not path.exists():
            raise SnapevalError(f"{path} does not exist", DATA_PATH_FIELD)
        return _single_file(path) if path.is_dir() else path
    data_dir = os.environ.get(DATA_DIR_ENV)
    if data_dir:
        path = Path(data_dir).expanduser() / source.local_path
        if not path.exists():
            raise SnapevalError(f"${DATA_DIR_ENV} is set but {path} does not exist", DATA_PATH_FIELD)
        return path
    return None


def _single_file(folder: Path) -> Path:
    files = sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES)
    if len(files) != 1:
        raise SnapevalError(f"{folder} must hold exactly one {'/'.join(SUFFIXES)} file", DATA_PATH_FIELD)
    return files[0]


def _read_file(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SnapevalError(
                f"{path}, line {exc.lineno}: invalid JSON ({exc.msg})", DATA_PATH_FIELD
            ) from None
        return _as_rows(rows, path)
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 is data
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise SnapevalError(f"{path}, line {number}: invalid JSON ({exc.msg})", DATA_PATH_FIELD) from None
        if not isinstance(rows[-1], dict):
            raise SnapevalError(f"{path}, line {number}: expected a JSON object", DATA_PATH_FIELD)
    return rows


def _as_rows(rows: Any, path: Path) -> list[dict[str, Any]]:
    if not isinstance(rows, Sequence) or not all(isinstance(row, dict) for row in rows):
        raise SnapevalError(f"{path}: expected a JSON list of objects", DATA_PATH_FIELD)
    return list(rows)


def _read_hub(source: DataSource) -> list[dict[str, Any]]:
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
