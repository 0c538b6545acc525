"""A confined program's root: the allow-listed paths it sees of the machine and its private folders."""

from __future__ import annotations

import os
import sys

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache")
PRIVATE_TMP = "/tmp"
"""The program's own small ``/tmp`` (a tmpfs)."""

_WORK_FOLDERS = ("/work", "/snapeval-work")


def allowed_paths(interpreter: str) -> list[str]:
    """What a confined program may see (read-only): the system's programs and libraries, and the
    interpreter with its standard library and site-packages (a virtual environment and its base).
    Only these paths are bound, never their parents' other files (a venv inside a clone shows the
    venv, not the clone)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    interpreters = {os.path.dirname(interpreter), os.path.dirname(os.path.realpath(interpreter))}
    python = sorted({os.path.realpath(p) for p in prefixes | interpreters} | prefixes | interpreters)
    covered = [p for p in python if not _within(p, SYSTEM_PATHS)]
    return [*SYSTEM_PATHS, *(p for p in covered if not _within(p, [o for o in covered if o != p]))]


def work_folder(allowed: list[str]) -> str:
    """Where the program's working folder is mounted inside its root: ``/work``, unless the
    interpreter itself lives exactly there (its files are bound into the private folders, never
    hidden by them, but a folder cannot be both)."""
    return next(folder for folder in _WORK_FOLDERS if not any(_within(folder, [p]) for p in allowed))


def _within(path: str, folders: list[str] | tuple[str, ...]) -> bool:
    """Whether ``path`` is one of ``folders`` or inside one of them."""
    return any(path == folder or path.startswith(f"{folder.rstrip('/')}/") for folder in folders)
