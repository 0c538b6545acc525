"""Offline RULER-style synthetic long-context tasks: needles hidden in a haystack of a given token length.

The kinds follow RULER (Hsieh et al., 2024), with its needle, question and answer templates:

* ``passkey``: one needle in the repeated noise haystack ("The grass is green. ..."); RULER's niah_single_1.
* ``niah_single``: one needle in a prose haystack; RULER's niah_single_2.
* ``niah_multikey``: four needles with different keys, one of them queried; RULER's niah_multikey_1.
* ``niah_multivalue``: four needles sharing one key, all values asked for; RULER's niah_multivalue.
* ``variable_tracking``: a chain ``VAR A = 12345``, ``VAR B = VAR A``, ... in the noise haystack; the
  answer is every variable bound to the value; RULER's vt (without its in-context example).

Keys are adjective-noun pairs, values 7-digit numbers. Prose comes from CPython's bundled documentation
(:mod:`pydoc_data.topics`), so generation never touches the network. Everything is drawn from a seed,
per sample, and the sample's needles do not depend on the length: the same seed and index hide the same
needles at the same depth at every ``context_length``.

Lengths are measured on what the model is fed, the chat-templated prompt of :func:`encode_chat`: each
prompt takes at most ``context_length`` tokens and falls short of it by a few tokens at most.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from random import Random
from typing import TYPE_CHECKING, Any, Literal

from snapeval.errors import SnapevalError
from snapeval.tasks.base import Task
from snapeval.tasks.ruler_haystack import Haystack, HaystackSource, Needle, haystack, weave

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ScoreMode = Literal["all", "part"]

NEEDLE = "One of the special magic numbers for {key} is: {value}."
VT_HOPS = 4
MAX_SAMPLES = 100_000  # samples a task generates (``num_prompts``, raised to ``limit``), all up front
MULTI_NEEDLES = 4

# fmt: off
_ADJECTIVES = (
    "amber", "brave", "calm", "clever", "crimson", "dusty", "eager", "gentle", "golden", "hollow",
    "humble", "jolly", "lively", "mellow", "misty", "noble", "quiet", "rustic", "silent", "sturdy",
)
_NOUNS = (
    "anchor", "badger", "beacon", "canyon", "castle", "comet", "falcon", "garden", "glacier", "harbor",
    "kettle", "lantern", "meadow", "orchard", "otter", "pebble", "sparrow", "teapot", "violin", "willow",
)
# fmt: on
KEYS = tuple(f"{adjective}-{noun}" for adjective in _ADJECTIVES for noun in _NOUNS)


@dataclass(frozen=True)
class SyntheticSample:
    """One generated prompt and the strings a correct answer contains.

    ``depth`` is the relative position (0 start, 1 end) in the haystack of the first needle that
    answers the question; ``metadata`` holds the query, every needle and its depth, the haystack
    source, the kind's score mode and the prompt's measured token count.
    """

    id: str
    prompt: str
    targets: list[str]
    kind: str
    context_length: int
    depth: float
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Plan:
    """A sample before its haystack: the framing text, the needles to hide and the expected answer."""

    instruction: str
    question: str
    needles: tuple[Needle, ...]
    targets: tuple[str, ...]
    query: str

    @property
    def depth(self) -> float:
        """Depth of the first needle that holds part of the answer."""
        return min(n.depth for n in self.needles if any(target in n.text for target in self.targets))


@dataclass(frozen=True)
class _Kind:
    plan: Callable[[Random], _Plan]
    haystack: HaystackSource
    score_mode: ScoreMode


def _niah_plan(rng: Random, num_keys: int, num_values: int) -> _Plan:
    """RULER's needle in a haystack: ``num_keys`` keys, ``num_values`` 7-digit values each, one key asked."""
    keys = rng.sample(KEYS, num_keys)
    values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), num_keys * num_values)]
    values_by_key = {key: values[i * num_values : (i + 1) * num_values] for i, key in enumerate(keys)}
    needles = tuple(
        Needle(NEEDLE.format(key=key, value=value), rng.random())
        for key, key_values in values_by_key.items()
        for value in key_values
    )
    query = rng.choice(keys)
    if num_values == 1:
        instruction = "A special magic number is hidden within the following text. "
        instruction += "Make sure to memorize it. I will quiz you about the number afterwards."
        question = f"What is the special magic number for {query} mentioned in the provided text?\n"
        question += f"The special magic number for {query} mentioned in the provided text is"
    else:
        instruction = "Some special magic numbers are hidden within the following text. "
        instruction += "Make sure to memorize it. I will quiz you about the numbers afterwards."
        question = f"What are all the special magic numbers for {query} mentioned in the provided text?\n"
        question += f"The special magic numbers for {query} mentioned in the provided text are"
    return _Plan(instruction, question, needles, tuple(values_by_key[query]), query)


def _variable_names(rng: Random, count: int) -> list[str]:
    """``count`` distinct 5-letter upper-case names."""
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    return names


def _variable_tracking_plan(rng: Random, num_hops: int) -> _Plan:
    """RULER's variable tracking: a chain of ``num_hops`` assignments from a 5-digit value, in text order."""
    names = _variable_names(rng, num_hops + 1)
    value = str(rng.randrange(10_000, 100_000))
    statements = [f"VAR {names[0]} = {value}."]
    statements += [f"VAR {name} = VAR {previous}." for previous, name in zip(names, names[1:], strict=False)]
    depths = sorted(rng.random() for _ in statements)
    instruction = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
    question = f"Question: Find all variables that are assigned the value {value} in the text above.\n"
    question += "Answer: According to the chain(s) of variable assignment in the text above, "
    question += f"{len(names)} variables are assigned the value {value}, they are:"
    needles = tuple(Needle(text, depth) for text, depth in zip(statements, depths, strict=True))
    return _Plan(instruction, question, needles, tuple(names), value)


_KINDS: dict[str, _Kind] = {
    "passkey": _Kind(partial(_niah_plan, num_keys=1, num_values=1), "noise", "all"),
    "niah_single": _Kind(partial(_niah_plan, num_keys=1, num_values=1), "prose", "all"),
    "niah_multikey": _Kind(partial(_niah_plan, num_keys=MULTI_NEEDLES, num_values=1), "prose", "all"),
    "niah_multivalue": _Kind(partial(_niah_plan, num_keys=1, num_values=MULTI_NEEDLES), "prose", "all"),
    "variable_tracking": _Kind(partial(_variable_tracking_plan, num_hops=VT_HOPS), "noise", "all"),
}
KINDS = tuple(_KINDS)
SCORE_MODES: dict[str, ScoreMode] = {name: kind.score_mode for name, kind in _KINDS.items()}


def _render(plan: _Plan, sentences: Sequence[str]) -> str:
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


def _fitted_prompt(
    plan: _Plan, haystack: Haystack, start: int, tokenizer: PreTrainedTokenizerBase, context_length: int
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
    kind: str, tokenizer: PreTrainedTokenizerBase, context_length: int, seed: int, index: int
) -> SyntheticSample:
    spec = _KINDS[kind]
    rng = Random(f"{kind}/{seed}/{index}")
    plan = spec.plan(rng)
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
    )


def generate(
    kind: str, tokenizer: PreTrainedTokenizerBase, context_length: int, num_samples: int, seed: int
) -> list[SyntheticSample]:
    """``num_samples`` samples of ``kind``, each at most ``context_length`` chat-templated tokens.

    Deterministic in ``seed``: sample ``i`` is drawn from its own generator, seeded by kind, seed and ``i``.
    """
    _check_kind(kind)
    if num_samples <= 0:
        raise SnapevalError(f"must be positive, got {num_samples}", "task.num_prompts")
    return [_sample(kind, tokenizer, context_length, seed, i) for i in range(num_samples)]


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
    """Plain dicts for an lm-eval ``custom_dataset``: id, prompt, targets, kind, context_length, depth."""
    return [
        {
            "id": s.id,
            "prompt": s.prompt,
            "targets": list(s.targets),
            "kind": s.kind,
            "context_length": s.context_length,
            "depth": s.depth,
        }
        for s in samples
    ]


class Ruler(Task):
    """The RULER-style tasks, one config per kind (``conf/task/ruler_<kind>.yaml``): ``kind``,
    ``context_length`` (tokens of the chat-templated prompt), ``num_prompts`` (raised to ``run.limit``)."""

    names = tuple(f"ruler_{kind}" for kind in KINDS)
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

    def rows(self, tokenizer: PreTrainedTokenizerBase | None) -> list[dict[str, Any]]:
        cfg = self.config
        return to_docs(generate(cfg["kind"], tokenizer, cfg["context_length"], self.num_samples, self.seed))

    def user_text(self, row) -> str:
        return row["prompt"]

    def target(self, row) -> list[str]:
        return list(row["targets"])

    def prompt_metadata(self, row) -> dict[str, Any]:
        return {"depth": row["depth"], "kind": row["kind"]}

    def score_row(self, row, output: str) -> dict[str, float]:
        return {"score": score(output, row["targets"], SCORE_MODES[row["kind"]])}
