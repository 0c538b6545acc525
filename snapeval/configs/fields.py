"""The declaration of one config field: its default, what it takes, and whether it is part of a result's
identity (stored with results, hashed).

Every field of the config dataclasses is a :func:`setting`, and its check is the one way a field is
checked (the task, model, run and cache declarations alike; relations between fields are checked in the
node's ``__post_init__``). :class:`Checked` runs the field checks in ``__post_init__``, so
``OmegaConf.to_object`` of a composed config refuses a bad value in one line naming the field
(:class:`~snapeval.errors.SnapevalError`). The checks here need neither torch nor the data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR

Check = Callable[[Any], "str | None"]  # None when the value is fine, else what the field takes

INT64_MAX = 2**63 - 1  # what a database column and a torch tensor hold
MAX_LEASE_S = 10**9  # about 31 years: an expiry date must stay within the calendar
MAX_SLOTS = 2**24
"""The most slots a cache parameter (a budget, a window, a ring, ...) may count: 16,777,216 positions, more
than any model's window; a larger one is refused before a model loads, not when its rows are allocated."""
PROMPT_STYLES = ("openai_chat", "llama3", "codeqwen", "qwq", "deepseek_r1")
"""lcb_runner's prompts by LMStyle, the default first (snapeval/tasks/livecodebench/prompts.py)."""
COUNTS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
)
"""Attributes of a Hugging Face config that count something (layers, heads, widths, tokens): at least 1."""
WEIGHT_SHAPES = tuple(key for key in COUNTS if key != "max_position_embeddings")
"""The counts that shape a model's weights: ``config_overrides`` may not change them (the weights would
not fit), only how the model runs (``rope_parameters``, ``max_position_embeddings``, ...)."""


def setting(
    default: Any = MISSING,
    *,
    check: Check | None = None,
    stored: bool = True,
    hashed: bool = True,
    when_set: bool = False,
    help: str = "",
) -> Any:
    """A dataclass field with its ``check`` (what it takes) and its part in a result's identity:
    ``stored`` with results, ``hashed`` into the config hash (a stored field may be left out of the hash:
    it names, it does not change a result), ``when_set``: stored only when not null (an optional node)."""
    metadata = {"check": check, "stored": stored, "hashed": stored and hashed, "when_set": when_set}
    metadata["help"] = help
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    if isinstance(default, type):  # a nested config: its defaults
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class Checked:
    """A config node whose fields check themselves on construction, named by their dotted path."""

    path: ClassVar[str] = ""  # where the node sits in the config tree (``task``, ``task.metadata``)

    def __post_init__(self) -> None:
        for item in fields(self):
            check = item.metadata.get("check")
            value = getattr(self, item.name)
            if check is not None and (takes := check(value)) is not None:
                raise SnapevalError(f"must be {takes}, got {value!r}", self.field_path(item.name))

    @classmethod
    def field_path(cls, name: str) -> str:
        return f"{cls.path}.{name}" if cls.path else name


def takes(check: Check | None) -> str:
    """What a field of ``check`` takes, in words (``an integer >= 0``)."""
    return (check(object()) if check else None) or "a value of its type"


def integer(low: int = 1, optional: bool = False, high: int = INT64_MAX) -> Check:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and value > high:
            return f"an integer <= {high}"
        return f"an integer >= {low}" + (" or null" if optional else "")

    return check


def slots(low: int = 1, optional: bool = False) -> Check:
    """A count of cache slots (a budget, a window, a ring, ...): an integer >= ``low`` and at most
    :data:`MAX_SLOTS`."""
    at_least = integer(low, optional)

    def check(value: Any) -> str | None:
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_SLOTS:
            return f"at most {MAX_SLOTS:,} slots (more positions than any model has)"
        return at_least(value)

    return check


def odd(value: Any) -> str | None:
    """A kernel width: a positive odd integer, at most :data:`MAX_SLOTS`."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SLOTS and value % 2:
        return None
    return "a positive odd integer" if not isinstance(value, int) or value <= MAX_SLOTS else slots()(value)


def number(low: float, high: float, low_open: bool = False) -> Check:
    def check(value: Any) -> str | None:
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if numeric and (low < value if low_open else low <= value) and value <= high:
            return None
        return f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"

    return check


def choice(*choices: Any, optional: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if (value is None and optional) or (value in choices and type(value) is type(choices[0])):
            return None
        return "one of " + ", ".join(map(str, choices)) + (" or null" if optional else "")

    return check


def iso_date(value: Any) -> str | None:
    if value is None:
        return None
    try:
        datetime.fromisoformat(str(value))
    except ValueError:
        return "an ISO date (2024-08-01) or null"
    return None


def device(value: Any) -> str | None:
    ok = isinstance(value, str) and re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value)
    return None if ok else "auto, cpu, mps, cuda or cuda:N"


def shard(value: Any) -> str | None:
    """``i/n`` with 0 <= i < n, or null."""
    match = re.fullmatch(r"(\d+)/(\d+)", str(value)) if value is not None else None
    if value is None or (match and int(match[1]) < int(match[2])):
        return None
    return "i/n with 0 <= i < n (say 0/4), or null"


def json_object(value: Any) -> str | None:
    """A JSON object written as a string (``'{"window_size": 64}'``)."""
    try:
        return None if isinstance(json.loads(value), dict) else 'a JSON object such as {"name": 1}'
    except (TypeError, ValueError):
        return 'a JSON object such as {"name": 1}'


def text(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def optional_text(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) else "a string or null"


boolean = choice(True, False)


# A model's name (``model.name``, ``cache.draft``) and its Hugging Face config's attributes (overrides)


def model_configs() -> list[str]:
    """The model configs a command line can choose (``model=NAME``): the names of ``conf/model/*.yaml``."""
    return sorted(path.stem for path in (CONF_DIR / "model").glob("*.yaml"))


def is_name(name: str) -> bool:
    """Whether ``name`` is a model's name or a Hub id (``owner/name``), not a path: at most one ``/``, no
    part empty or starting with ``.`` or ``~`` (``..``), no ``\\`` or unprintable character."""
    parts = name.split("/")
    return len(parts) <= 2 and all(
        part and part[0] not in ".~" and "\\" not in part and part.isprintable() for part in parts
    )


def model_entry(name: object) -> Path | None:
    """The file of model config ``name`` (``conf/model/<name>.yaml``); None if there is none (a path, or
    a Hub id, never names one)."""
    if not isinstance(name, str) or not is_name(name) or "/" in name:
        return None
    path = CONF_DIR / "model" / f"{name}.yaml"
    return path if path.is_file() else None


def model_name(value: Any) -> str | None:
    """A model's name (see :func:`is_name`)."""
    if isinstance(value, str) and is_name(value):
        return None
    return f"a name or a Hub id (owner/name), not a path (model configs: {', '.join(model_configs())})"


def overrides_mapping(value: Any) -> str | None:
    """Attributes to set on a Hugging Face config, by name, or null."""
    if value is None or (isinstance(value, Mapping) and all(isinstance(key, str) for key in value)):
        return None
    return "a mapping of config attributes (such as {rope_theta: 100000.0}) or null"


def count_error(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` for Hugging Face config attribute ``key`` (None: nothing known): a
    :data:`COUNTS` attribute is an integer >= 1, or null (unset: the class derives it)."""
    if value is None or key not in COUNTS:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be an integer >= 1, got {value!r}"
    return None
