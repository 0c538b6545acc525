"""Signals that end a run: SIGTERM (``kill``, a scheduler's preemption, a launcher stopping its ranks)
ends it as Ctrl-C does, as interrupted, never left running.

A plain process stops where the signal finds it (:class:`Terminated`, a :class:`KeyboardInterrupt`). The
ranks of a tensor-parallel run cannot: each would stop at another point of its work, and those still
computing would wait forever in a collective for the one that left. There a signal (SIGTERM or SIGINT)
is noted, and :meth:`Stops.check`, called between decode steps, where every rank stands at the same
point, shares the notes (one all-reduce) so that every rank stops there together; a second signal
stops a rank at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM: the run stops as if interrupted."""


class Stops:
    """The signals a run has received and not yet acted on (tensor parallel only)."""

    def __init__(self, together: bool) -> None:
        self.together = together
        self.received = 0  # the signal number of the first signal noted, 0 for none
        self.device: Any = None  # where the ranks' collectives run, found at the first check

    def check(self) -> None:
        """Stop (raise) if any rank received a signal: every rank learns it here, at the same point."""
        if not self.together:
            return
        import torch
        import torch.distributed as dist

        if self.device is None:
            nccl = dist.get_backend() == "nccl"
            self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        shared = torch.tensor([self.received], device=self.device)
        dist.all_reduce(shared, op=dist.ReduceOp.MAX)  # SIGTERM (15) outranks SIGINT (2)
        raise_for(int(shared.item()))


def raise_for(signum: int) -> None:
    """Raise what ``signum`` ends a run with (nothing for 0)."""
    if signum == signal.SIGTERM:
        raise Terminated
    if signum:
        raise KeyboardInterrupt


@contextmanager
def stop_on_signals(tensor_parallel: bool) -> Iterator[Stops]:
    """While the block runs (main thread only), SIGTERM ends it as :class:`Terminated`; under
    ``tensor_parallel``, SIGTERM and SIGINT are noted for :meth:`Stops.check` instead, a second one
    raising at once. Once stopping, further signals are ignored, so that closing the runs is not cut
    short."""
    stops = Stops(together=tensor_parallel)
    if threading.current_thread() is not threading.main_thread():
        yield stops
        return
    stopping = False

    def note(signum: int, frame: Any) -> None:
        nonlocal stopping
        if stopping:
            return
        if stops.together and not stops.received:
            stops.received = signum
            return
        stopping = True
        raise_for(signum)

    handled = (signal.SIGTERM, signal.SIGINT) if tensor_parallel else (signal.SIGTERM,)
    previous = {signum: signal.signal(signum, note) for signum in handled}
    try:
        yield stops
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
