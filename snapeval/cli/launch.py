"""``snapeval run --nproc N [overrides]``: a tensor-parallel run on N processes of this machine, started
and reported as one command.

It starts N ranks of ``python -m snapeval [overrides]``, each with the environment torchrun gives
(``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` on a free port of 127.0.0.1,
``OMP_NUM_THREADS`` shared out as torchrun does), and then speaks for them: rank 0 prints and writes
(its output is the command's), the others' output is kept back, and a rank that fails where rank 0 said
nothing of it is named in one line. The first rank to fail ends the others (each sees its peer gone and
closes its runs; a rank still alive after :data:`GRACE_S` is stopped by SIGTERM, then SIGKILL), and the
command exits with rank 0's code, else the failed rank's. Ctrl-C or SIGTERM reaches every rank, which
stop together as interrupted (130 or 143).

Why not torch's elastic launcher (torchrun): it is built for restarts across nodes, and a rank's
refusal comes back from it as its own multi-line ``ChildFailedError`` with exit code 1; N local
processes with a free port need only :mod:`subprocess`. torchrun stays supported for several nodes.
Standard library only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from snapeval.errors import SnapevalError

FIELD = "--nproc"
GRACE_S = 10.0  # a rank still running this long after another failed is stopped
KILL_AFTER_S = 30.0  # a rank still running this long after SIGTERM is killed (as torchrun does)
CHUNK = 4096
TAIL_BYTES = 16_384  # of each rank's stderr, kept for the line that names its failure
POLL_S = 0.1


def split_nproc(argv: Sequence[str]) -> tuple[int | None, list[str]]:
    """``--nproc N`` (or ``--nproc=N``) taken out of ``argv``: the count (None without one) and the rest."""
    rest, count, args = [], None, list(argv)
    while args:
        arg = args.pop(0)
        if arg == FIELD or arg.startswith(FIELD + "="):
            raw = arg.partition("=")[2] if "=" in arg else (args.pop(0) if args else "")
            if not raw.strip().isdigit() or int(raw) < 1:
                raise SnapevalError(f"{raw!r} is not a number of processes (1 or more)", FIELD)
            count = int(raw)
        else:
            rest.append(arg)
    return count, rest


def launch(count: int, argv: Sequence[str], module: str = "snapeval") -> int:
    """Run ``python -m module argv`` on ``count`` ranks of this machine; the command's exit code."""
    if os.environ.get("WORLD_SIZE", "").strip():
        raise SnapevalError(
            f"this process is a rank already (WORLD_SIZE={os.environ['WORLD_SIZE']}): give --nproc or "
            "start it with torchrun, not both",
            FIELD,
        )
    ranks = _start(count, [sys.executable, "-m", module, *argv])
    return _Watch(ranks).wait()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start(count: int, command: list[str]) -> list[_Rank]:
    threads = str(max(1, (os.cpu_count() or 1) // count))
    shared = {
        "WORLD_SIZE": str(count),
        "LOCAL_WORLD_SIZE": str(count),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads),
    }
    return [_Rank(rank, command, shared) for rank in range(count)]


class _Rank:
    """One started rank; its stderr read as it comes (rank 0's passed on to the command's own, progress
    bars and all), its last lines kept. Rank 0's stdout is the command's; another's is dropped."""

    def __init__(self, rank: int, command: list[str], shared: dict[str, str]) -> None:
        self.rank = rank
        environment = {**os.environ, **shared, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        self.process = subprocess.Popen(
            command,
            env=environment,
            stdout=None if rank == 0 else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.tail = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stream = self.process.stderr
        while chunk := stream.read1(CHUNK):
            if self.rank == 0:
                sys.stderr.buffer.write(chunk)
                sys.stderr.flush()
            self.tail = (self.tail + chunk)[-TAIL_BYTES:]

    def errors(self) -> list[str]:
        """The lines this rank said that are an error or an interruption."""
        self.reader.join(timeout=5)
        lines = self.tail.decode(errors="replace").splitlines()
        return [line for line in lines if line.startswith(("error:", "interrupted:"))]

    def how(self) -> str:
        """How this rank ended (it has): its exit code or signal."""
        code = self.process.returncode
        return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


class _Watch:
    """Waits for the ranks, ends them all when one fails or a signal comes, and says what happened."""

    def __init__(self, ranks: list[_Rank]) -> None:
        self.ranks = ranks
        self.signalled: int | None = None
        self.first_failed: _Rank | None = None
        self.stopped = False  # whether this launcher stopped ranks that outlived a failed one
        self.previous = {
            signum: signal.signal(signum, self._forward) for signum in (signal.SIGINT, signal.SIGTERM)
        }

    def _forward(self, signum: int, frame: object) -> None:
        """Pass a signal on to every rank (a second one too: it stops a rank at once)."""
        self.signalled = self.signalled or signum
        for rank in self.ranks:
            if rank.process.poll() is None:
                rank.process.send_signal(signum)

    def wait(self) -> int:
        """Wait until every rank has ended; the command's exit code."""
        try:
            failed_at = None
            while any(rank.process.poll() is None for rank in self.ranks):
                if failed_at is None and (failed := self._failed()) is not None:
                    self.first_failed, failed_at = failed, time.monotonic()
                if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                    self._stop()
                time.sleep(POLL_S)
            self.first_failed = self.first_failed or self._failed()
        finally:
            for signum, handler in self.previous.items():
                signal.signal(signum, handler)
        return self._outcome()

    def _failed(self) -> _Rank | None:
        return next((rank for rank in self.ranks if rank.process.poll() not in (None, 0)), None)

    def _stop(self) -> None:
        """SIGTERM to the ranks still running, SIGKILL to those still running after :data:`KILL_AFTER_S`."""
        self.stopped = True
        for rank in self.ranks:
            if rank.process.poll() is None:
                rank.process.terminate()
        deadline = time.monotonic() + KILL_AFTER_S
        for rank in self.ranks:
            try:
                rank.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                rank.process.kill()
                rank.process.wait()

    def _outcome(self) -> int:
        """Rank 0's exit code (130 or 143 where a signal stopped the command; the first failed rank's
        where rank 0 did not end by itself), after a line naming the rank that failed first where rank 0
        did not say what it said."""
        first, leader = self.first_failed, self.ranks[0]
        code = leader.process.returncode
        if first is not None and first is not leader and self.signalled is None:
            said = first.errors()
            if not said or said[-1] not in leader.errors():
                reason = f": {said[-1]}" if said else ""
                print(f"error: {FIELD}: rank {first.rank} {first.how()}{reason}", file=sys.stderr, flush=True)
            if code <= 0 or self.stopped:
                code = first.process.returncode
        if code < 0:
            return 128 - code
        if code == 0 and self.signalled is not None:
            return 128 + self.signalled
        return code
