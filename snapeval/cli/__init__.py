"""What every snapeval command line shares.

- A :class:`~snapeval.errors.SnapevalError` ends a command in one line on stderr, ``error: <field>:
  <what>``, with exit code 2 (:data:`EXIT_BAD_INPUT`), never a traceback: :func:`one_line_errors`
  wraps a ``main``, :func:`report` prints one error.
- A reader of standard output that stops early (``| head``) ends a command quietly (:func:`stdout_closed`),
  with the exit code of a process that SIGPIPE ended, as Unix tools end.
- Ctrl-C while something heavy loads still ends a command as interrupted (:func:`keep_interrupts`).
- :mod:`snapeval.cli.world`: the launcher's world (torchrun's ranks) and who of them writes;
  :mod:`snapeval.cli.launch`: ``snapeval run --nproc N``, which starts the ranks itself.

Standard library only at import: the front door refuses bad input before anything heavy loads.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec

from snapeval.errors import SnapevalError

EXIT_BAD_INPUT = 2
EXIT_STDOUT_CLOSED = 128 + signal.SIGPIPE  # 141: what a shell shows for a process that SIGPIPE ended

P = ParamSpec("P")


def error_line(error: BaseException) -> str:
    """``error: <field>: <what>``, on one line whatever the message holds."""
    return "error: " + " ".join(line.strip() for line in str(error).splitlines())


def report(error: SnapevalError) -> int:
    """Print ``error`` in one line on stderr; the exit code of bad input (2). Under torchrun (a process
    group started) every rank says its line before any ends: a refusal every rank reaches alike."""
    print(error_line(error), file=sys.stderr, flush=True)
    distributed = sys.modules.get("torch.distributed")  # under torchrun: every rank says it, then all end
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.barrier()
        distributed.destroy_process_group()
    return EXIT_BAD_INPUT


def stdout_closed() -> int:
    """After a BrokenPipeError on standard output: what is left to print goes nowhere (not even at
    exit, where Python would flush it and print a traceback); the exit code of a SIGPIPE ending (141)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_STDOUT_CLOSED


def one_line_errors(main: Callable[P, int]) -> Callable[P, int]:
    """``main``, whose :class:`SnapevalError` is reported in one line and exits with code 2."""

    @functools.wraps(main)
    def command(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except SnapevalError as error:
            return report(error)

    return command


@contextmanager
def keep_interrupts() -> Iterator[None]:
    """Ctrl-C inside the block ends it with :class:`KeyboardInterrupt`, even where Python drops one: raised
    in a finalizer (a garbage-collected object's callback while torch loads, say), it is only printed, in
    lines, and the command goes on. Such a one is kept silent and raised as the block ends."""
    dropped: list[BaseException] = []
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            dropped.append(unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
    if dropped:
        raise KeyboardInterrupt
