"""Offline RULER-style synthetic long-context tasks: needles hidden in a haystack of a given token length.

The kinds follow RULER (Hsieh et al., 2024), with its needle, question and answer templates
(:mod:`snapeval.tasks.ruler_plans`):

* ``passkey``: one needle in the repeated noise haystack ("The grass is green. ..."); RULER's niah_single_1.
* ``niah_single``: one needle in a prose haystack; RULER's niah_single_2.
* ``niah_multikey``: four needles with different keys, one of them queried; RULER's niah_multikey_1.
* ``niah_multivalue``: four needles sharing one key, all values asked for; RULER's niah_multivalue.
* ``variable_tracking``: a chain ``VAR A = 12345``, ``VAR B = VAR A``, ... in the noise haystack; the
  answer is every variable bound to the value; RULER's vt (without its in-context example).
* ``niah_multiturn``: ``turns`` needles with different keys in prose, one key asked a turn, on one context.
* ``vt_multiturn``: a chain of ``turns`` variables in noise, followed one step a turn: which variable is
  assigned the value, then which is assigned the variable before.

Prose comes from CPython's bundled documentation (:mod:`pydoc_data.topics`), so generation never touches
the network. Everything is drawn from a seed, per sample, and the sample's needles do not depend on the
length: the same seed and index hide the same needles at the same depth at every ``context_length``.

Lengths are measured on what the model is fed, the chat-templated prompt of :func:`encode_chat`: each
prompt (the first turn's, for a multi-turn kind) takes at most ``context_length`` tokens and falls short
of it by a few tokens at most.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from random import Random
from typing import TYPE_CHECKING, Any, Literal

from snapeval.configs.task import MAX_TURNS
from snapeval.errors import SnapevalError
from snapeval.tasks.base import Task
from snapeval.tasks.ruler_haystack import Haystack, HaystackSource, haystack, weave
from snapeval.tasks.ruler_plans import (
    MULTI_NEEDLES,
    NIAH_QUESTION,
    VT_HOPS,
    VT_QUESTION,
    VT_STEP_QUESTION,
    Plan,
    Turn,
    niah_plan,
    niah_turns_plan,
    variable_tracking_plan,
    vt_turns_plan,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ScoreMode = Literal["all", "part"]

MAX_SAMPLES = 100_000  # samples a task generates (``num_prompts``, raised to ``limit``), all up front
DEFAULT_TURNS = 4
"""The questions a multi-turn kind asks when its config names none (a partial config, lm-eval's)."""


@dataclass(frozen=True)
class SyntheticSample:
    """One generated prompt and the strings a correct answer contains.

    ``depth`` is the relative position (0 start, 1 end) in the haystack of the first needle that
    answers the question; ``metadata`` holds the query, every needle and its depth, the haystack
    source, the kind's score mode and the prompt's measured token count. ``followups``: the questions
    of the later turns of a multi-turn kind, each with its targets.
    """

    id: str
    prompt: str
    targets: list[str]
    kind: str
    context_length: int
    depth: float
    metadata: dict[str, Any] = field(default_factory=dict)
    followups: tuple[Turn, ...] = ()


@dataclass(frozen=True)
class _Kind:
    """A kind's plan (a multi-turn kind's takes the number of turns), haystack, score mode, and where its
    (first) question starts."""

    plan: Callable[..., Plan]
    haystack: HaystackSource
    score_mode: ScoreMode
    query_start: str
    multi_turn: bool = False


_KINDS: dict[str, _Kind] = {
    "passkey": _Kind(partial(niah_plan, num_keys=1, num_values=1), "noise", "all", NIAH_QUESTION),
    "niah_single": _Kind(partial(niah_plan, num_keys=1, num_values=1), "prose", "all", NIAH_QUESTION),
    "niah_multikey": _Kind(
        partial(niah_plan, num_keys=MULTI_NEEDLES, num_values=1), "prose", "all", NIAH_QUESTION
    ),
    "niah_multivalue": _Kind(
        partial(niah_plan, num_keys=1, num_values=MULTI_NEEDLES), "prose", "all", "What are all the"
    ),
    "variable_tracking": _Kind(
        partial(variable_tracking_plan, num_hops=VT_HOPS), "noise", "all", VT_QUESTION
    ),
    "niah_multiturn": _Kind(niah_turns_plan, "prose", "all", NIAH_QUESTION, multi_turn=True),
    "vt_multiturn": _Kind(vt_turns_plan, "noise", "all", VT_STEP_QUESTION, multi_turn=True),
}
KINDS = tuple(_KINDS)
MULTI_TURN_KINDS = tuple(kind for kind, spec in _KINDS.items() if spec.multi_turn)
SCORE_MODES: dict[str, ScoreMode] = {name: kind.score_mode for name, kind in _KINDS.items()}


def _render(plan: Plan, sentences: Sequence[str]) -> str:
    return f"{plan.instruction}\n{weave(sentences, plan.needles)}\n{plan.question}"


def prompt_tokens(tokenizer: PreTrainedTokenizerBase, prompt: str) -> int:
    """Tokens the model is fed for ``prompt``: the chat-templated user turn (a base model's: the text)."""
    from snapeval.models import encode_chat  # torch loads with the tokenizer, not with the task's config

    return len(encode_chat(tokenizer, [{"role": "user", "content": prompt}]))


def _check_kind(kind: str) -> None:
    if kind not in _KINDS:
        raise SnapevalError(
            f"unknown synthetic task kind {kind!r}; choose one of {', '.join(KINDS)}", "task.kind"
        )


def query_start(kind: str) -> str:
    """Where the (first) question of ``kind`` starts: a query-agnostic prompt is compressed before it."""
    _check_kind(kind)
    return _KINDS[kind].query_start


def _fitted_prompt(
    plan: Plan, haystack: Haystack, start: int, tokenizer: PreTrainedTokenizerBase, context_length: int
) -> tuple[str, int]:
    """The prompt with as much haystack from ``start`` as fits ``context_length`` tokens, and its token count.

    Sentence lengths add up to the prompt's but for a token or two where pieces join, so each fill is
    checked on the real encoding and shrunk by the overshoot until it fits.
    """
    bare = prompt_tokens(tokenizer, _render(plan, []))
    if bare > context_length:
        raise SnapevalError(
            f"context_length {context_length} is too small: the instructions, needles and question "
            f"alone take {bare} tokens",
            "task.context_length",
        )
    budget = context_length - bare
    while True:
        prompt = _render(plan, haystack.fill(start, budget))
        tokens = prompt_tokens(tokenizer, prompt)
        if tokens <= context_length:
            return prompt, tokens
        budget -= tokens - context_length


def _sample(
    kind: str, tokenizer: PreTrainedTokenizerBase, context_length: int, seed: int, index: int, turns: int
) -> SyntheticSample:
    spec = _KINDS[kind]
    rng = Random(f"{kind}/{seed}/{index}")
    plan = spec.plan(rng, turns) if spec.multi_turn else spec.plan(rng)
    sentences = haystack(tokenizer, spec.haystack)
    start = rng.randrange(len(sentences.sentences))
    prompt, tokens = _fitted_prompt(plan, sentences, start, tokenizer, context_length)
    metadata = {
        "query": plan.query,
        "needles": [n.text for n in plan.needles],
        "needle_depths": [n.depth for n in plan.needles],
        "haystack": spec.haystack,
        "score_mode": spec.score_mode,
        "num_tokens": tokens,
    }
    return SyntheticSample(
        id=f"{kind}-{context_length}-{seed}-{index}",
        prompt=prompt,
        targets=list(plan.targets),
        kind=kind,
        context_length=context_length,
        depth=plan.depth,
        metadata=metadata,
        followups=plan.followups,
    )


def _turns(kind: str, turns: int | None) -> int:
    """The questions a sample of ``kind`` asks: ``turns`` (by default :data:`DEFAULT_TURNS`) for a
    multi-turn kind, in [1, :data:`MAX_TURNS`]; one for any other kind, which takes no ``turns``."""
    if not _KINDS[kind].multi_turn:
        if turns is not None:
            message = f"kind {kind} asks one question; only {', '.join(MULTI_TURN_KINDS)} take turns"
            raise SnapevalError(message, "task.turns")
        return 1
    turns = DEFAULT_TURNS if turns is None else turns
    if not isinstance(turns, int) or isinstance(turns, bool) or not 1 <= turns <= MAX_TURNS:
        raise SnapevalError(f"must be an integer in [1, {MAX_TURNS}], got {turns!r}", "task.turns")
    return turns


def generate(
    kind: str,
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
    num_samples: int,
    seed: int,
    turns: int | None = None,
) -> list[SyntheticSample]:
    """``num_samples`` samples of ``kind``, each at most ``context_length`` chat-templated tokens; a
    multi-turn kind's ask ``turns`` questions each (:data:`DEFAULT_TURNS` when None).

    Deterministic in ``seed``: sample ``i`` is drawn from its own generator, seeded by kind, seed and ``i``.
    """
    _check_kind(kind)
    asked = _turns(kind, turns)
    if num_samples <= 0:
        raise SnapevalError(f"must be positive, got {num_samples}", "task.num_prompts")
    return [_sample(kind, tokenizer, context_length, seed, i, asked) for i in range(num_samples)]


def score(prediction: str, targets: Sequence[str], mode: ScoreMode = "all") -> float:
    """RULER's string match, case-insensitive: ``all`` is the fraction of targets found in ``prediction``,
    ``part`` is 1.0 when any is."""
    if not targets:
        raise ValueError("score needs at least one target")
    found = [target.lower() in prediction.lower() for target in targets]
    if mode == "all":
        return sum(found) / len(found)
    if mode == "part":
        return float(any(found))
    raise SnapevalError(f"unknown score mode {mode!r}; choose one of all, part")


def to_docs(samples: Sequence[SyntheticSample]) -> list[dict[str, Any]]:
    """Plain dicts for an lm-eval ``custom_dataset``: id, prompt, targets, kind, context_length, depth; a
    multi-turn sample's later questions (``followups``) and their targets (``followup_targets``) too."""
    return [
        {
            "id": s.id,
            "prompt": s.prompt,
            "targets": list(s.targets),
            "kind": s.kind,
            "context_length": s.context_length,
            "depth": s.depth,
            **(
                {
                    "followups": [turn.question for turn in s.followups],
                    "followup_targets": [list(turn.targets) for turn in s.followups],
                }
                if s.followups
                else {}
            ),
        }
        for s in samples
    ]


class Ruler(Task):
    """The RULER-style tasks, one config per kind (``conf/task/ruler_<kind>.yaml``): ``kind``,
    ``context_length`` (tokens of the chat-templated prompt), ``num_prompts`` (raised to ``run.limit``),
    ``turns`` (a multi-turn kind's questions, carried by its rows); ``compression=query_agnostic``
    compresses the prompt before its (first) question. This class serves the one-turn configs."""

    names = tuple(f"ruler_{kind}" for kind in KINDS if kind not in MULTI_TURN_KINDS)
    metrics = ("score",)
    reads_as_text = True  # each question ends with the answer's opening ("The pass key is")
    id_field = "id"
    needs_tokenizer = True

    def __init__(self, cfg: Mapping[str, Any], seed: int = 0, limit: int | None = None) -> None:
        super().__init__(cfg, seed, limit)
        self.num_samples: int = max(cfg["num_prompts"], limit or 0)
        if self.num_samples > MAX_SAMPLES:
            field = "run.limit" if (limit or 0) > cfg["num_prompts"] else "task.num_prompts"
            raise SnapevalError(
                f"{self.num_samples} samples would be generated before the first is evaluated; "
                f"a generated task makes at most {MAX_SAMPLES:,}",
                field,
            )
        self.turns: int | None = self.config.get("turns")
        if self.config.get("compression") == "query_agnostic":
            self.query_start = query_start(self.config["kind"])

    def rows(self, tokenizer: PreTrainedTokenizerBase | None) -> list[dict[str, Any]]:
        cfg = self.config
        samples = generate(
            cfg["kind"], tokenizer, cfg["context_length"], self.num_samples, self.seed, self.turns
        )
        return to_docs(samples)

    def user_text(self, row) -> str:
        return row["prompt"]

    def followups(self, row) -> tuple[str, ...]:
        return tuple(row.get("followups", ()))

    def target(self, row) -> list[str] | list[list[str]]:
        """The first question's targets; for several turns, every turn's, in order."""
        turns = _turn_targets(row)
        return list(turns[0]) if len(turns) == 1 else [list(targets) for targets in turns]

    def prompt_metadata(self, row) -> dict[str, Any]:
        return {"depth": row["depth"], "kind": row["kind"]}

    def score_row(self, row, output: str) -> dict[str, float]:
        return self.score_turn(row, 0, output)

    def score_turn(self, row, turn: int, output: str) -> dict[str, float]:
        return {"score": score(output, _turn_targets(row)[turn], SCORE_MODES[row["kind"]])}


class RulerTurns(Ruler):
    """The multi-turn RULER-style tasks (``ruler_niah_multiturn``, ``ruler_vt_multiturn``): ``turns``
    questions of one context, the first in the prompt, each later one a user turn after the answers
    before it; each answer scored as RULER scores its question (``turn_1``, ``turn_2``, ... and their
    mean, ``score``)."""

    names = tuple(f"ruler_{kind}" for kind in MULTI_TURN_KINDS)
    multi_turn = True


def _turn_targets(row: Mapping[str, Any]) -> list[Sequence[str]]:
    """The targets of each question of a row, the first's first."""
    return [row["targets"], *row.get("followup_targets", ())]
