"""The launcher's world: the processes a launcher (torchrun, ``snapeval run --nproc N``) started, read from
the environment it gives each one.

A launcher sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` (and ``MASTER_ADDR``/``MASTER_PORT``, where
rank 0 waits for its peers); :func:`launcher_world` reads them, and a plain ``python`` run is a world of
one. A malformed environment (``RANK=abc``, or ``RANK=1`` in a world of one) is refused in one line, by
every command alike. Only the writer (rank 0, :func:`writing_rank`) writes databases, files and tables;
the other ranks compute alongside it. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from snapeval.errors import SnapevalError

FIELD = "model.tp"  # what a refusal names: the launcher's world, as a TP degree
RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")
"""Where rank 0 waits for its peers: set by the launcher beside the world's size and ranks."""


@dataclass(frozen=True)
class World:
    """The processes the launcher started: ``size`` of them, this one ``rank`` (``local_rank`` on its
    node)."""

    size: int = 1
    rank: int = 0
    local_rank: int = 0

    @property
    def parallel(self) -> bool:
        """Whether this is a tensor-parallel run (more than one process)."""
        return self.size > 1


def launcher_world(environ: Mapping[str, str] | None = None) -> World:
    """The world the launcher describes in ``environ`` (``os.environ``): WORLD_SIZE, RANK, LOCAL_RANK; a
    world of one where they are not set."""
    environ = os.environ if environ is None else environ
    values = {}
    for key, default in (("WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)):
        raw = environ.get(key, "")
        try:
            values[key] = int(raw) if raw.strip() else default
        except ValueError:
            raise SnapevalError(
                f"{key}={raw!r} is not a whole number (a launcher's variable)", FIELD
            ) from None
    size, rank, local = values["WORLD_SIZE"], values["RANK"], values["LOCAL_RANK"]
    if size < 1 or not 0 <= rank < size or local < 0:
        raise SnapevalError(
            f"WORLD_SIZE={size}, RANK={rank}, LOCAL_RANK={local} is not a world: a launcher sets them "
            "together (unset them, or start the ranks with snapeval run --nproc N or torchrun)",
            FIELD,
        )
    return World(size, rank, local)


def writing_rank(world: World | None = None) -> bool:
    """Whether this process writes databases, files and tables: a plain process, or rank 0 of a launch;
    a malformed launcher environment is a :class:`SnapevalError`."""
    return (world or launcher_world()).rank == 0


def rendezvous_address(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Where rank 0 of a launched world waits for its peers (``MASTER_ADDR``, ``MASTER_PORT``); one line
    naming what is missing or malformed."""
    environ = os.environ if environ is None else environ
    missing = [name for name in RENDEZVOUS_VARIABLES if not environ.get(name, "").strip()]
    if missing:
        raise SnapevalError(
            f"WORLD_SIZE={environ.get('WORLD_SIZE')} starts a tensor-parallel world, but "
            f"{' and '.join(missing)} (where rank 0 waits for its peers) is not set: start the ranks with "
            "snapeval run --nproc N or torchrun, or set MASTER_ADDR and MASTER_PORT on every rank",
            FIELD,
        )
    port = environ["MASTER_PORT"].strip()
    if not port.isdigit() or not 0 < int(port) < 2**16:
        raise SnapevalError(f"MASTER_PORT={port!r} is not a port (1 to 65535)", FIELD)
    return environ["MASTER_ADDR"].strip(), int(port)
