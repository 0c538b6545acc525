"""Where the ranks of a tensor-parallel launch meet before their process group starts.

Rank 0 holds a store at ``MASTER_ADDR:MASTER_PORT`` (under torchrun its agent holds it) and waits for
every rank to join; the others connect to it. All of them wait at most ``run.rendezvous_s``, and one
still waiting after :data:`WAITING_NOTE_S` says whom it waits for and where. Ranks that never come end
each waiting rank in one line. A joining rank first knocks on the port itself (a plain TCP connect,
retried), so that a store not up yet costs no c10d retry logs, only the one note.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

from snapeval.cli.world import World, rendezvous_address
from snapeval.errors import SnapevalError

FIELD = "run.rendezvous_s"
WAITING_NOTE_S = 3.0  # a rank still waiting to meet its peers after this says so
KNOCK_EVERY_S = 0.25
AGENT_STORE_VARIABLE = "TORCHELASTIC_USE_AGENT_STORE"
"""torchrun's word that its agent holds the ranks' store (torch's env:// rendezvous reads the same)."""


def rendezvous(world: World, rendezvous_s: float) -> Any:
    """The store where the ranks of ``world`` meet (prefixed as torch's own ``env://`` rendezvous does),
    once every rank has joined; a :class:`SnapevalError` on ``run.rendezvous_s`` if they do not within
    ``rendezvous_s``."""
    import torch.distributed as dist

    address, port = rendezvous_address()
    holds = world.rank == 0 and os.environ.get(AGENT_STORE_VARIABLE) != "True"
    where = f"rank {world.rank} of {world.size}"
    waiting = (
        f"{where}: waiting for the {world.size} ranks to meet at {address}:{port} "
        f"(at most {rendezvous_s:g} s: run.rendezvous_s)"
    )
    deadline = time.monotonic() + rendezvous_s
    if not holds:
        _knock(address, port, deadline, where, waiting)
    note = None if not holds else _later_note(waiting)
    try:
        store = dist.TCPStore(
            address,
            port,
            world.size,
            is_master=holds,
            timeout=timedelta(seconds=max(deadline - time.monotonic(), 1.0)),
            wait_for_workers=True,
        )
    except (RuntimeError, ValueError) as exc:  # DistStoreError (a timeout), DistNetworkError (the port)
        raise _not_met(where, address, port, rendezvous_s, exc) from None
    finally:
        if note is not None:
            note.cancel()
    return dist.PrefixStore("default_pg", store)


def _knock(address: str, port: int, deadline: float, where: str, waiting: str) -> None:
    """Return once something listens at ``address:port``; say ``waiting`` once after
    :data:`WAITING_NOTE_S`; a :class:`SnapevalError` on ``where`` (this rank) past ``deadline``."""
    started, said = time.monotonic(), False
    while True:
        try:
            socket.create_connection((address, port), timeout=1.0).close()
            return
        except OSError as exc:
            now = time.monotonic()
            if now >= deadline:
                raise _not_met(where, address, port, deadline - started, exc) from None
            if not said and now - started >= WAITING_NOTE_S:
                print(waiting, file=sys.stderr, flush=True)
                said = True
            time.sleep(KNOCK_EVERY_S)


def _later_note(text: str) -> Any:
    """A timer that prints ``text`` after :data:`WAITING_NOTE_S` unless cancelled first."""
    import threading

    timer = threading.Timer(WAITING_NOTE_S, lambda: print(text, file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    return timer


def _not_met(where: str, address: str, port: int, waited: float, cause: BaseException) -> SnapevalError:
    text = str(cause).strip()
    reason = text.splitlines()[0][:200] if text else type(cause).__name__
    return SnapevalError(
        f"{where}: the ranks did not meet at {address}:{port} within {waited:g} s ({reason}); start "
        f"all of them (snapeval run --nproc N, or torchrun), or wait longer",
        FIELD,
    )
