"""A deployed engine's setting against snapeval's reference of the same setting, on the same samples: the
numbers that the report's "Engine against reference" section and the engine gate share.

Four runs meet: the engine's setting and its full cache, snapeval's at the same setting and its full
cache. Every number is taken on the samples all of the stored ones scored (by sample id): both
accuracies, answer agreement with snapeval (:func:`snapeval.stats.agreement.agreement`), each engine's
retention against its own full cache (:func:`snapeval.stats.retention`) and, for a compressed setting,
the test of "compression not applied?" (:func:`snapeval.stats.agreement.unchanged`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from snapeval.stats.agreement import Agreement, Unchanged, agreement, unchanged
from snapeval.stats.retention import CONFIDENCE, Retention, retention

Answers = Mapping[str, tuple[str, float]]
"""A run's scored samples: ``(output, score)`` by sample id."""


def answers_of(rows: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, float]]:
    """The :data:`Answers` of stored sample rows (``sample_id``, ``output``, ``score``); unscored ones left
    out, a missing output read as empty."""
    return {
        str(row["sample_id"]): (str(row["output"] or ""), float(row["score"]))
        for row in rows
        if row["score"] is not None
    }


@dataclass(frozen=True)
class EnginePairing:
    """The engine's setting against snapeval's on the ``n`` samples every stored run scored. None where a
    run it needs is not stored: ``agreement`` without snapeval's setting, each retention without that
    side's full cache (and for the full cache itself), ``unchanged`` without all four runs."""

    n: int
    engine_accuracy: float
    reference_accuracy: float
    agreement: Agreement | None
    engine_retention: Retention | None
    reference_retention: Retention | None
    unchanged: Unchanged | None

    @property
    def flagged(self) -> bool:
        """Flagged "compression not applied?"."""
        return self.unchanged is not None and self.unchanged.flagged


def pair_engine(
    engine: Answers,
    reference: Answers | None,
    engine_full: Answers | None = None,
    reference_full: Answers | None = None,
    confidence: float = CONFIDENCE,
) -> EnginePairing:
    """``engine`` (the engine's setting) against ``reference`` (snapeval's of the same setting), each
    against its full cache where given (None: the setting is the full cache, or that run is not stored)."""
    stored = [answers for answers in (engine, reference, engine_full, reference_full) if answers is not None]
    ids = sorted(set.intersection(*(set(answers) for answers in stored)))
    if not ids:
        return EnginePairing(0, math.nan, math.nan, None, None, None, None)

    def outputs(answers: Answers) -> list[str]:
        return [answers[i][0] for i in ids]

    def scores(answers: Answers) -> list[float]:
        return [answers[i][1] for i in ids]

    def mean(answers: Answers | None) -> float:
        return math.nan if answers is None else sum(scores(answers)) / len(ids)

    def kept(mine: Answers | None, full: Answers | None) -> Retention | None:
        return None if mine is None or full is None else retention(scores(mine), scores(full), confidence)

    test = None
    if engine_full is not None and reference is not None and reference_full is not None:
        changes = (outputs(engine), outputs(engine_full), outputs(reference), outputs(reference_full))
        test = unchanged(*changes, confidence=confidence)
    return EnginePairing(
        n=len(ids),
        engine_accuracy=mean(engine),
        reference_accuracy=mean(reference),
        agreement=None if reference is None else agreement(outputs(engine), outputs(reference), confidence),
        engine_retention=kept(engine, engine_full),
        reference_retention=kept(reference, reference_full),
        unchanged=test,
    )
