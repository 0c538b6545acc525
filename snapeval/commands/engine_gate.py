"""The engine gate (``kind: engine`` in a gate spec): a deployed engine's compressed setting against
snapeval's reference of the same setting, judged from the database alone (it runs nothing: the engine's
server need not be up). It fails when the setting is flagged "compression not applied?", when the lower
end of its answer agreement with snapeval's setting (exact 95% interval) is below ``min_agreement``,
when its retention against the engine's own full cache does not show ``min_retained`` (the one-sided 95%
lower bound, as a retention gate), or when fewer than ``min_n`` samples are paired
(:func:`snapeval.stats.pair_engine`)::

    - name: llamacpp-streaming-256
      kind: engine
      task: [task=ruler_passkey, task.context_length=1024, run.limit=40]
      backend: [model.backend=lm_eval:local-completions]   # model.backend and model.backend_args only
      cache: [cache=streaming_llm, cache.budget=256]
      min_agreement: 0.8
      min_retained: 0.75
      min_n: 40
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from snapeval.commands.gate_spec import (
    check_counts,
    check_entry,
    check_overrides,
    check_sides,
    finite,
    gate_config,
    located,
    one_setting,
    stored_samples,
)
from snapeval.configs.backend import lm_eval_model
from snapeval.configs.check import check
from snapeval.errors import SnapevalError
from snapeval.results import ResultsDB
from snapeval.stats import Answers, EnginePairing, Retention, answers_of, pair_engine
from snapeval.stats.agreement import NOT_APPLIED

ENGINE = "engine"
FIELDS = ("name", "kind", "task", "backend", "cache", "min_agreement", "min_retained", "min_n")
BACKEND_OVERRIDE = re.compile(r"(\+{1,2})?model\.backend(_args)?=.+", flags=re.DOTALL)
"""An override of who answers (``model.backend=lm_eval:<model>``, ``model.backend_args=k=v,...``)."""
SIDES = {"reference full": "task", "reference": "cache", "engine full": "backend", "engine": "backend"}
"""The four runs a gate pairs, and the spec key an error in each is located at (checked in this order)."""


@dataclass(frozen=True)
class EngineGate:
    """An engine's compressed setting against snapeval's at the same setting, on one task setting."""

    name: str
    task: tuple[str, ...]
    backend: tuple[str, ...]
    cache: tuple[str, ...]
    min_agreement: float
    min_retained: float
    min_n: int

    @classmethod
    def from_spec(cls, spec: object, where: str) -> EngineGate:
        """The gate of one ``kind: engine`` entry of a spec file; ``where`` locates it in error messages."""
        name, _, task, backend, cache, min_agreement, min_retained, min_n = check_entry(spec, FIELDS, where)
        for key, overrides in (("task", task), ("backend", backend), ("cache", cache)):
            check_overrides(overrides, f"{where}.{key}")
        check_sides(task, cache, where)
        if not any(override.lstrip("+").startswith("model.backend=") for override in backend) or not all(
            BACKEND_OVERRIDE.fullmatch(override) for override in backend
        ):
            message = f"must be model.backend=lm_eval:<model> (and model.backend_args=...), got {backend!r}"
            raise SnapevalError(message, f"{where}.backend")
        if not finite(min_agreement) or not 0 <= min_agreement <= 1:
            message = f"must be a number in [0, 1], got {min_agreement!r}"
            raise SnapevalError(message, f"{where}.min_agreement")
        check_counts(min_retained, min_n, where)
        return cls(
            name, tuple(task), tuple(backend), tuple(cache), float(min_agreement), float(min_retained), min_n
        )

    def overrides(self) -> dict[str, tuple[str, ...]]:
        """The overrides of each run the gate pairs (:data:`SIDES`)."""
        return {
            "reference full": (*self.task, "cache=full"),
            "reference": (*self.task, *self.cache),
            "engine full": (*self.task, *self.backend, "cache=full"),
            "engine": (*self.task, *self.backend, *self.cache),
        }

    def configs(self, db_url: str) -> dict[str, dict[str, Any]]:
        return {side: gate_config(overrides, db_url) for side, overrides in self.overrides().items()}

    def check(self, where: str, db_url: str) -> None:
        """Each run's config checked before anything loads; the engine's must name a deployed engine."""
        for side, overrides in self.overrides().items():
            with located(f"{where}.{SIDES[side]}"):
                config = gate_config(overrides, db_url)
                one_setting(config, "cache" if side in ("engine", "reference") else "task")
                check(config)
                backend = config["model"].get("backend")
                if side.startswith("engine") and lm_eval_model(backend) is None:
                    message = f"must name a deployed engine (lm_eval:<model>), got {backend}"
                    raise SnapevalError(message, "model.backend")


@dataclass(frozen=True)
class EngineVerdict:
    """An engine gate judged on the samples its four runs stored."""

    gate: EngineGate
    pairing: EnginePairing

    def failures(self) -> list[str]:
        """Why the gate fails (none: it passes)."""
        gate, pairing = self.gate, self.pairing
        failures = [NOT_APPLIED] if pairing.flagged else []
        if pairing.n < gate.min_n:
            failures.append(f"{pairing.n} paired samples (required >= {gate.min_n})")
        if pairing.agreement is not None and pairing.agreement.low < gate.min_agreement:
            failures.append(f"agreement below {gate.min_agreement:g}")
        if (
            pairing.engine_retention is not None
            and pairing.engine_retention.verdict(gate.min_retained) != "pass"
        ):
            failures.append(f"retention not shown to keep {gate.min_retained:g}")
        return failures

    @property
    def passed(self) -> bool:
        return not self.failures()

    def report(self) -> str:
        """A few readable lines: the verdict and why, agreement, both retentions, the flag's counts."""
        gate, pairing = self.gate, self.pairing
        failures = self.failures()
        head = f"{'FAIL' if failures else 'PASS'} {gate.name} ({' '.join((*gate.backend, *gate.cache))})"
        if not pairing.n:
            return f"{head}: no sample is stored for all of the engine's and snapeval's runs of this setting"
        agreement, test = pairing.agreement, pairing.unchanged
        assert agreement is not None and test is not None  # all four runs stored: every number is taken
        lines = [
            f"{head}: {'; '.join(failures) or 'agrees with snapeval and keeps its accuracy'}",
            f"    agreement with snapeval's setting: {agreement.same} of {agreement.n} answers the same, "
            f"95% interval [{agreement.low:.3f}, {agreement.high:.3f}] (the lower end required >= "
            f"{gate.min_agreement:g})",
            f"    retention against its own full cache: {_bounds(pairing.engine_retention)} "
            f"(the lower one required >= {gate.min_retained:g}); snapeval's: "
            f"{_bounds(pairing.reference_retention)}",
            f"    answers changed against the full cache: the engine's {test.changed} of {test.n}, "
            f"snapeval's {test.reference_changed} ({NOT_APPLIED!r} when the engine's are 0 and snapeval's >= "
            f"{test.needed})",
            f"    paired samples: {pairing.n} (required >= {gate.min_n})",
        ]
        return "\n".join(lines)


def _bounds(bounds: Retention | None) -> str:
    return "-" if bounds is None else f"{bounds.ratio:.3f} [{bounds.lower:.3f}, {bounds.upper:.3f}]"


def judge_engine(gate: EngineGate, db: ResultsDB) -> EngineVerdict:
    """The gate's verdict on the samples stored under its four configs."""
    answers: dict[str, Answers] = {
        side: answers_of(stored_samples(db, config)) for side, config in gate.configs(db.url).items()
    }
    pairing = pair_engine(
        answers["engine"], answers["reference"], answers["engine full"], answers["reference full"]
    )
    return EngineVerdict(gate, pairing)
