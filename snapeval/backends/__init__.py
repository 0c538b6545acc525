"""Who answers a run's requests: snapeval's own engine (the continuous batcher, :mod:`snapeval.decode`)
or a deployed engine through lm-eval's clients (:mod:`snapeval.backends.lm_eval`). Both take the same
:class:`~snapeval.decode.continuous.Request` and give the same :class:`~snapeval.decode.continuous.Answer`,
so that the runner stores, scores and compares their answers alike. A deployed engine's server may be
started by snapeval for each cache setting (``engine.serve``: :mod:`snapeval.backends.serve`); what the
engine is, is stored with each of its runs (:mod:`snapeval.backends.identity`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # importing the room loads no torch: its checks run before a model loads
    from snapeval.decode.continuous import Answer, Request

TRUNCATED = "server_truncated"
"""The ``extra`` key of a stored sample whose prompt a deployed engine cut without saying so (its server
counted fewer prompt tokens than were sent): a note in words, counted by the report."""


class Answerer(Protocol):
    """What the runner needs of whoever answers its requests."""

    rows: int  # how many requests it answers at once (the runner claims samples that many at a time)

    def reserve(self, requests: Iterable[Request]) -> None:
        """Make room for ``requests`` before they are answered (the batcher sizes its rows)."""

    def run(
        self,
        requests: Iterable[Request],
        on_answer: Callable[[Answer], Iterable[Request] | None],
        more: Callable[[], Iterable[Request]] | None = None,
        between_steps: Callable[[], None] | None = None,
    ) -> None:
        """Answer every request, each answer handed to ``on_answer`` (which may return follow-ups);
        ``more`` is asked for further requests when none wait; ``between_steps`` runs between decode
        steps where there are any."""
