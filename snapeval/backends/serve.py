"""A served engine's process: ``engine.serve``'s command, started for one cache setting on a free port
of its own, waited for until its ``/v1/models`` answers, and stopped when the setting is evaluated.

The command runs without a shell, in a session (and process group) of its own, its output in a log kept
beside the results (:func:`log_path`). It is stopped with SIGTERM to its group, then SIGKILL after
:data:`STOP_GRACE_S`: when its setting is done, on Ctrl-C or SIGTERM, on a failed run, at exit, and on
Linux when snapeval itself is killed (the kernel's parent-death signal). A server that exits before it
answers, or never answers within ``engine.ready_s``, ends the run in one line with its log's last lines.
Standard library only.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapeval.backends.identity import Reply, ask, models_url
from snapeval.configs.engine import (
    FIELD,
    serve_command,
    serve_template,
    serve_values,
    served_arguments,
)
from snapeval.errors import SnapevalError
from snapeval.results.connect import sqlite_path

STOP_GRACE_S = 10.0
"""How long a server has to exit after SIGTERM before its process group is killed."""
POLL_S = 0.25
"""Between two questions to a starting server."""
DYING_S = 1.0
"""How long a failed run waits to tell whether its server is exiting (a client sees the connection drop
a moment before the server's exit code is there)."""
TAIL_LINES = 5
"""The log's last lines an error quotes."""
TAIL_CHARS = 600
LOG_FOLDER = "engine-logs"
"""Beside a SQLite database; under ``results/`` of the working directory for PostgreSQL."""
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class Served:
    """What a run talks to: its client's arguments (``{port}`` filled), and the command it started and
    that command's log (None where the server runs elsewhere)."""

    backend_args: str | None
    command: str | None = None
    log: Path | None = None
    models: Reply | None = None  # the started server's first answer to /v1/models


def log_path(db_url: str, config_hash: str, run_id: int) -> Path:
    """The log of the server of run ``run_id``: ``engine-logs/<hash>-run<id>.log`` beside a SQLite
    database, else (PostgreSQL) under ``results/`` of the working directory."""
    database = sqlite_path(db_url)
    folder = (database.parent if database is not None else Path("results")) / LOG_FOLDER
    return (folder / f"{config_hash[:16]}-run{run_id}.log").absolute()


def free_port(taken: set[int]) -> int:
    """A port nothing listens on now, and none of ``taken`` (the ports of this run's earlier servers)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        if port not in taken:
            return port


@contextmanager
def served(
    config: Mapping[str, Any], cache: Mapping[str, Any], log: Path, taken: set[int]
) -> Iterator[Served]:
    """The engine that answers the setting ``cache``: the server ``engine.serve`` starts for it on a port
    not in ``taken`` (which it joins), running until the block ends; without ``engine.serve``, the
    server the user runs."""
    template, arguments = serve_template(config), config["model"].get("backend_args")
    if template is None:
        yield Served(arguments)
        return
    port = free_port(taken)
    taken.add(port)
    command = serve_command(template, serve_values(port, config, cache))
    arguments = served_arguments(arguments, port)
    with ServedEngine(command, str(models_url(arguments)), log, config["engine"]["ready_s"]) as engine:
        yield Served(arguments, shlex.join(command), log, engine.models)


class ServedEngine:
    """One server process: started and waited for on entering, stopped on leaving (and at exit)."""

    def __init__(self, command: list[str], models: str, log: Path, ready_s: float) -> None:
        self.command, self.url, self.log, self.ready_s = command, models, log, ready_s
        self.process: subprocess.Popen[bytes] | None = None
        self.models: Reply | None = None

    def __enter__(self) -> ServedEngine:
        try:
            self.start()
            self.wait()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        code = self.exit_code(DYING_S if isinstance(error, Exception) else 0)
        self.stop()
        if isinstance(error, Exception) and code is not None:  # the run failed because its server died
            raise SnapevalError(
                f"the server exited (code {code}) during the run; {self.tail()}", FIELD
            ) from None

    def exit_code(self, within: float) -> int | None:
        """The server's exit code if it exits within ``within`` seconds; None while it runs."""
        if self.process is None:
            return None
        with suppress(subprocess.TimeoutExpired):
            return self.process.wait(within) if within else self.process.poll()
        return None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            try:
                self.process = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own group: stopped whole, spared the terminal's Ctrl-C
                    preexec_fn=dies_with(os.getpid()),
                )
            except OSError as exc:
                raise SnapevalError(f"cannot start {self.command[0]!r} ({exc.strerror})", FIELD) from None
        atexit.register(self.stop)

    def wait(self) -> None:
        """Until the server answers ``/v1/models`` with 200; one line if it exits or runs out of time."""
        deadline = time.monotonic() + self.ready_s
        while True:
            if (code := self.exit_code(0)) is not None:
                raise SnapevalError(f"the server exited (code {code}) before answering; {self.tail()}", FIELD)
            reply = ask(self.url, timeout=1.0)
            if reply is not None and reply.status == 200:
                self.models = reply
                return
            if time.monotonic() > deadline:
                said = "nothing" if reply is None else f"HTTP {reply.status}"
                raise SnapevalError(
                    f"the server did not answer {self.url} within {self.ready_s:g} s (engine.ready_s; it "
                    f"answered {said}); {self.tail()}",
                    FIELD,
                )
            time.sleep(POLL_S)

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after :data:`STOP_GRACE_S`; idempotent (a stop
        that Ctrl-C cuts short is done again at exit)."""
        if self.process is None:
            return
        group = self.process.pid
        with suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE_S)
        with suppress(ProcessLookupError):  # what of the group is left: the leader, or its children
            os.killpg(group, signal.SIGKILL)
        self.process.wait()
        atexit.unregister(self.stop)

    def tail(self) -> str:
        """The log's path and its last :data:`TAIL_LINES` lines, on one line."""
        try:
            text = self.log.read_bytes()[-8 * TAIL_CHARS :].decode(errors="replace")
        except OSError:
            text = ""
        lines = [line.strip() for line in text.splitlines() if line.strip()][-TAIL_LINES:]
        return f"its log's last lines ({self.log}): {' | '.join(lines)[-TAIL_CHARS:] or '(empty)'}"


def dies_with(parent: int) -> Callable[[], None] | None:
    """On Linux, what the server runs before its command: the kernel kills it when ``parent`` (the thread
    that started it) ends, SIGKILLed or not; and at once if ``parent`` is already gone."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls it

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec
