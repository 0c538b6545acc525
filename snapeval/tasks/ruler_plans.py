"""What each RULER kind hides and asks: the needles, the instruction before the haystack, the question after
it and the strings a correct answer contains, with RULER's needle, question and answer templates; for the
multi-turn kinds, the questions of the later turns too.

Keys are adjective-noun pairs, values 7-digit numbers (variable tracking: 5-letter names and a 5-digit
value). A plan is drawn from its generator alone, so a sample's needles do not depend on its length.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from random import Random

from snapeval.tasks.ruler_haystack import Needle

NEEDLE = "One of the special magic numbers for {key} is: {value}."
VT_HOPS = 4
MULTI_NEEDLES = 4
NIAH_QUESTION = "What is the special magic number for"
"""How a question for one key's value starts: where a query-agnostic prompt is split."""
VT_QUESTION = "Question: Find all variables"
VT_STEP_QUESTION = "Question: Which variable is assigned"

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
class Turn:
    """A question asked after the first, on the same context, and the strings its answer contains."""

    question: str
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """A sample before its haystack: the framing text, the needles to hide, the first question's answer,
    and the questions of the later turns (none for a one-turn kind)."""

    instruction: str
    question: str
    needles: tuple[Needle, ...]
    targets: tuple[str, ...]
    query: str
    followups: tuple[Turn, ...] = ()

    @property
    def depth(self) -> float:
        """Depth of the first needle that holds part of the first answer."""
        return min(n.depth for n in self.needles if any(target in n.text for target in self.targets))


def _key_question(key: str) -> str:
    """RULER's question for the one value of ``key``, ending where the answer begins."""
    question = f"{NIAH_QUESTION} {key} mentioned in the provided text?\n"
    return question + f"The special magic number for {key} mentioned in the provided text is"


def niah_plan(rng: Random, num_keys: int, num_values: int) -> Plan:
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
        question = _key_question(query)
    else:
        instruction = "Some special magic numbers are hidden within the following text. "
        instruction += "Make sure to memorize it. I will quiz you about the numbers afterwards."
        question = f"What are all the special magic numbers for {query} mentioned in the provided text?\n"
        question += f"The special magic numbers for {query} mentioned in the provided text are"
    return Plan(instruction, question, needles, tuple(values_by_key[query]), query)


def niah_turns_plan(rng: Random, turns: int) -> Plan:
    """``turns`` needles with distinct keys, one 7-digit value each; turn k asks for the k-th key's value."""
    keys = rng.sample(KEYS, turns)
    values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), turns)]
    needles = tuple(
        Needle(NEEDLE.format(key=key, value=value), rng.random())
        for key, value in zip(keys, values, strict=True)
    )
    instruction = "Some special magic numbers are hidden within the following text. "
    instruction += "Make sure to memorize it. I will quiz you about the numbers afterwards."
    followups = tuple(
        Turn(_key_question(key), (value,)) for key, value in zip(keys[1:], values[1:], strict=True)
    )
    return Plan(instruction, _key_question(keys[0]), needles, (values[0],), keys[0], followups)


def _variable_names(rng: Random, count: int) -> list[str]:
    """``count`` distinct 5-letter upper-case names."""
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    return names


def _chain(rng: Random, length: int) -> tuple[list[str], str, tuple[Needle, ...]]:
    """A chain of ``length`` variables from a 5-digit value (``VAR A = 12345.``, ``VAR B = VAR A.``, ...),
    its statements at sorted depths, in text order: the names, the value and the needles."""
    names = _variable_names(rng, length)
    value = str(rng.randrange(10_000, 100_000))
    statements = [f"VAR {names[0]} = {value}."]
    statements += [f"VAR {name} = VAR {previous}." for previous, name in zip(names, names[1:], strict=False)]
    depths = sorted(rng.random() for _ in statements)
    return names, value, tuple(Needle(text, depth) for text, depth in zip(statements, depths, strict=True))


VT_INSTRUCTION = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
_VT_ANSWER = "Answer: According to the chain(s) of variable assignment in the text above, "


def variable_tracking_plan(rng: Random, num_hops: int) -> Plan:
    """RULER's variable tracking: a chain of ``num_hops`` assignments from a 5-digit value, in text order."""
    names, value, needles = _chain(rng, num_hops + 1)
    question = f"{VT_QUESTION} that are assigned the value {value} in the text above.\n"
    question += f"{_VT_ANSWER}{len(names)} variables are assigned the value {value}, they are:"
    return Plan(VT_INSTRUCTION, question, needles, tuple(names), value)


def _step_question(source: str) -> str:
    """The question for the variable that ``source`` (a value, or ``VAR NAME``) is assigned to."""
    question = f"{VT_STEP_QUESTION} {source} in the text above?\n"
    return question + f"{_VT_ANSWER}the variable assigned {source} is"


def vt_turns_plan(rng: Random, turns: int) -> Plan:
    """A chain of ``turns`` variables asked step by step: turn 1 which variable is assigned the value,
    turn k which variable is assigned the (k-1)-th variable."""
    names, value, needles = _chain(rng, turns)
    followups = tuple(
        Turn(_step_question(f"VAR {previous}"), (name,))
        for previous, name in zip(names, names[1:], strict=False)
    )
    return Plan(VT_INSTRUCTION, _step_question(f"the value {value}"), needles, (names[0],), value, followups)
