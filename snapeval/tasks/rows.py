"""Reading a benchmark's rows: from a local file or folder, ``$SNAPEVAL_DATA_DIR`` or the Hugging Face Hub.

Rows are read in this order: an explicit ``data_path`` (a .jsonl/.json/.parquet file, or a folder holding
one), then ``$SNAPEVAL_DATA_DIR/<relative path>`` (laid out like the project's shared data:
``aime24/test.jsonl``, ...), then the Hub dataset id. A local file must be a regular file of at most
:data:`MAX_DATA_BYTES` (checked before it is opened: a FIFO would block, a device never end). Bad rows
stop with the file and line (or row and id) named: a missing field, a repeated id, a value the task cannot
score.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from snapeval.errors import SnapevalError
from snapeval.tasks.hub import DATA_DIR_ENV, DATA_PATH_FIELD, DataSource, read_hub

SUFFIXES = (".jsonl", ".json", ".parquet")
MAX_DATA_BYTES = 2 << 30
"""The largest local data file read (2 GiB): a file is read whole into memory (the shared data's largest,
LongBench-v2's, is 19 MB)."""
_FILE_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def load_rows(
    source: DataSource,
    data_path: str | None = None,
    id_field: str | None = None,
    problem: Callable[[Mapping[str, Any]], str | None] | None = None,
) -> list[dict[str, Any]]:
    """All rows of ``source``, checked for its required fields; with ``id_field``, each holds an id no
    other row has; with ``problem``, a row it finds unfit (its answer: what is wrong) is refused."""
    path = local_file(source, data_path)
    rows = _read_file(path) if path else read_hub(source)
    where = str(path) if path else source.hub_id
    if not rows:
        raise SnapevalError(f"{where} holds no rows", DATA_PATH_FIELD)
    required = tuple(dict.fromkeys((*source.required, *([id_field] if id_field else []))))
    first: dict[str, int] = {}
    for index, row in enumerate(rows, start=1):
        missing = [field for field in required if field not in row]
        if missing:
            raise SnapevalError(
                f"{where}, row {index}: missing field(s) {', '.join(missing)}", DATA_PATH_FIELD
            )
        row_id = f" ({id_field} {short_repr(row[id_field])})" if id_field else ""
        if id_field and first.setdefault(str(row[id_field]), index) != index:
            message = f"{where}, rows {first[str(row[id_field])]} and {index} have the same {row_id[2:-1]}"
            raise SnapevalError(f"{message}: each problem must be listed once", DATA_PATH_FIELD)
        if problem and (wrong := problem(row)):
            raise SnapevalError(f"{where}, row {index}{row_id}: {wrong}", DATA_PATH_FIELD)
    return rows


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a hostile row may hold megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def local_file(source: DataSource, data_path: str | None) -> Path | None:
    """The local file rows of ``source`` are read from, or None for the Hub."""
    if data_path:
        path = Path(data_path).expanduser()
        if not path.exists():
            raise SnapevalError(f"{path} does not exist", DATA_PATH_FIELD)
        return _regular_file(_single_file(path) if path.is_dir() else path)
    data_dir = os.environ.get(DATA_DIR_ENV)
    if data_dir:
        path = Path(data_dir).expanduser() / source.local_path
        if not path.exists():
            raise SnapevalError(f"${DATA_DIR_ENV} is set but {path} does not exist", DATA_PATH_FIELD)
        return _regular_file(path)
    return None


def _regular_file(path: Path) -> Path:
    """``path``, a regular file of at most :data:`MAX_DATA_BYTES`, judged without opening it."""
    try:
        info = path.stat()
    except OSError as exc:
        raise SnapevalError(f"{path}: cannot read ({exc.strerror or exc})", DATA_PATH_FIELD) from None
    if not stat.S_ISREG(info.st_mode):
        kind = _FILE_KINDS.get(stat.S_IFMT(info.st_mode), "a socket or another special file")
        raise SnapevalError(f"{path} is not a regular file but {kind}", DATA_PATH_FIELD)
    if info.st_size > MAX_DATA_BYTES:
        limit = f"the {MAX_DATA_BYTES >> 30} GiB a data file may have"
        raise SnapevalError(f"{path} has {info.st_size:,} bytes, over {limit}", DATA_PATH_FIELD)
    return path


def _single_file(folder: Path) -> Path:
    files = sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES)
    if len(files) != 1:
        raise SnapevalError(f"{folder} must hold exactly one {'/'.join(SUFFIXES)} file", DATA_PATH_FIELD)
    return files[0]


def _read_file(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            return pd.read_parquet(path).to_dict("records")
        except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid and ArrowIOError among them
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SnapevalError(f"{path}: not a readable Parquet file ({reason})", DATA_PATH_FIELD) from None
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        byte = exc.object[exc.start]
        message = f"{path}, line {line}: not UTF-8 text (byte {byte:#04x} at offset {exc.start})"
        raise SnapevalError(message, DATA_PATH_FIELD) from None
    except OSError as exc:
        raise SnapevalError(f"{path}: cannot read ({exc.strerror or exc})", DATA_PATH_FIELD) from None
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
