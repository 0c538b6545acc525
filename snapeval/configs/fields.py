"""The declaration of one config field: its default, what it takes, and whether it is part of a result's
identity (stored with results, hashed).

Every field of the config dataclasses is a :func:`setting`; :class:`Checked` runs the field checks in
``__post_init__``, so ``OmegaConf.to_object`` of a composed config refuses a bad value in one line naming
the field (:class:`~snapeval.errors.SnapevalError`). The checks here need neither torch nor the data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from typing import Any, ClassVar

from snapeval.errors import SnapevalError

Check = Callable[[Any], "str | None"]  # None when the value is fine, else what the field takes

INT64_MAX = 2**63 - 1  # what a database column and a torch tensor hold
MAX_LEASE_S = 10**9  # about 31 years: an expiry date must stay within the calendar
PROMPT_STYLES = ("openai_chat", "llama3", "codeqwen", "qwq", "deepseek_r1")
"""lcb_runner's prompts by LMStyle (snapeval/tasks/livecodebench/prompts.py)."""


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
