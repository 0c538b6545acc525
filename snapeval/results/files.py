"""The files a command writes: never one of its inputs nor a database, and written whole or not at all.

:func:`safe_output` refuses, before any work, an output that is (or resolves to, through symlinks or
``..``) one of the command's inputs, any SQLite database (told by its first bytes, :func:`is_sqlite`), a
file SQLite keeps beside one (:func:`sidecar_of`: its write-ahead log, which holds committed transactions
the database file may not have yet, its shared memory or its rollback journal), a folder or a special
file. :func:`write_atomically` writes through a temporary file beside the output, renamed into place,
so that a full disk or a kill leaves the old file (or none), never part of one.

Standard library only: commands check their outputs before anything heavy loads.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from snapeval.errors import SnapevalError

SQLITE_HEADER = b"SQLite format 3\x00"  # the first bytes of every SQLite database file
SIDECARS = ("-wal", "-shm", "-journal")  # SQLite's files beside a database X: X-wal, X-shm, X-journal
_NAME_KEPT = 200  # of the output's name in its temporary file's, within the 255 bytes a name may have


def is_sqlite(path: Path) -> bool:
    """Whether the file ``path`` starts as every SQLite database does (an OSError if it cannot be read)."""
    with path.open("rb") as file:
        return file.read(len(SQLITE_HEADER)) == SQLITE_HEADER


def sidecar_of(path: Path) -> tuple[Path, str] | None:
    """The SQLite database whose ``-wal``, ``-shm`` or ``-journal`` file ``path`` is (by its name as given
    or resolved), with that suffix; None when ``path`` is no such file of an existing database."""
    for name in dict.fromkeys((os.fspath(path), os.path.realpath(path))):
        for suffix in SIDECARS:
            database = Path(name.removesuffix(suffix))
            with suppress(OSError):
                if name.endswith(suffix) and database.is_file() and is_sqlite(database):
                    return database, suffix
    return None


def sidecar_message(path: Path, database: Path, suffix: str, named: str | None = None) -> str:
    """Why ``path``, the ``suffix`` file of ``database`` (the file of option ``named``), is not written."""
    of = f"the SQLite database {database}" if named is None else f"{named} ({database})"
    return f"{path} is the {suffix} file of {of}: writing it would damage that database; give another file"


def safe_output(path: Path, inputs: Mapping[str, Path | None], field: str) -> Path:
    """``path`` resolved (symlinks and ``..``) if a command may write it: not the file of one of its
    ``inputs`` (option to file, None for none), not a SQLite database nor a file SQLite keeps beside one,
    a folder nor a special file; else a :class:`SnapevalError` on ``field``."""
    target = Path(os.path.realpath(path))
    given = {option: source for option, source in inputs.items() if source is not None}
    for option, source in given.items():
        if _same_file(target, source):
            named = "" if os.fspath(path) == os.fspath(source) else f" ({source})"
            raise SnapevalError(
                f"{path} is the file of {option}{named}: writing it would destroy it; give another file",
                field,
            )
    if sidecar := sidecar_of(path):
        owner, suffix = sidecar
        resolved = Path(os.path.realpath(owner))
        named = next((option for option, source in given.items() if _same_file(resolved, source)), None)
        raise SnapevalError(sidecar_message(path, owner, suffix, named), field)
    if target.is_dir():
        raise SnapevalError(f"{path} is a directory; give a file name", field)
    if not target.exists():
        return target
    if not target.is_file():
        raise SnapevalError(f"{path} is not a regular file (a device, FIFO or socket); give a file", field)
    try:
        database = is_sqlite(target)
    except OSError as exc:
        raise SnapevalError(f"cannot read {path} to check it is no database: {exc.strerror}", field) from None
    if database:
        raise SnapevalError(
            f"{path} is a SQLite database: writing it would destroy it; give another file", field
        )
    return target


def _same_file(target: Path, source: Path) -> bool:
    """Whether ``target`` (resolved) is ``source``: the same path once resolved, or a hard link to it."""
    if target == Path(os.path.realpath(source)):
        return True
    with suppress(OSError):
        return os.path.samefile(target, source)
    return False


@contextmanager
def write_atomically(path: Path, *, binary: bool = False) -> Iterator[IO[Any]]:
    """A handle (text, UTF-8, or ``binary``) on a temporary file beside ``path`` (resolved), renamed onto
    it when the block ends; an error removes the temporary file and leaves ``path`` as it was. A file
    that ``path`` replaces keeps its permissions."""
    target = Path(os.path.realpath(path))
    temporary = target.with_name(f".{target.name[:_NAME_KEPT]}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with suppress(FileNotFoundError):
            os.fchmod(descriptor, stat.S_IMODE(target.stat().st_mode))
        mode, encoding = ("wb", None) if binary else ("w", "utf-8")
        with open(descriptor, mode, encoding=encoding, newline=None if binary else "") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with suppress(OSError):
            temporary.unlink()
        raise
