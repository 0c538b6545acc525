"""The AIME scorers of the official harnesses, each giving its original's verdict on any output:

* ``qwen_math``: Qwen2.5-Math's evaluation (:mod:`snapeval.tasks.qwen_math_grader`), the reference of
  the README and of R-KV's AIME numbers;
* ``math_verify``: Hugging Face's math-verify, the library itself: ``verify(parse(gold), parse(output))``;
* ``lm_eval``: lm-eval's ``aime24`` task (``lm_eval/tasks/aime/utils.py``, ``process_results``): the text
  between the first and last ``$``, or the last ``\\boxed``, compared after MATH's ``strip_string``.

``tests/data/aime_probes.jsonl`` holds each original's verdicts on answer strings, and the tests hold
every scorer to them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from math_verify import parse, verify

from snapeval.tasks import qwen_math_grader

_MATH_VERIFY_TIMEOUT_S = 5


def math_verify_score(output: str, gold: str) -> bool:
    """math-verify's verdict (its timeouts use SIGALRM, which only the main thread may install)."""
    timeout = _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(gold, parsing_timeout=timeout)
    return bool(verify(gold_parsed, parse(output, parsing_timeout=timeout), timeout_seconds=timeout))


def lm_eval_score(output: str, gold: str) -> bool:
    """lm-eval ``aime24``'s verdict (its ``exact_match``)."""
    dollars = [index for index, char in enumerate(output) if char == "$"]
    answer = output if len(dollars) <= 1 else output[dollars[0] + 1 : dollars[-1]]
    boxed = _last_boxed(output)
    if boxed is not None:
        with contextlib.suppress(AssertionError, IndexError):
            answer = _unbox(boxed)
    try:
        return _math_strip(answer) == _math_strip(gold)
    except Exception:  # noqa: BLE001 - lm-eval compares the raw strings when normalizing fails
        return answer == gold


def _last_boxed(text: str) -> str | None:
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if text[index] == "}" and depth == 0:
            return text[start : index + 1]
    return None


def _unbox(boxed: str) -> str:
    if "\\boxed " in boxed:
        assert boxed.startswith("\\boxed ")
        return boxed[len("\\boxed ") :]
    assert boxed.startswith("\\boxed{") and boxed[-1] == "}"
    return boxed[len("\\boxed{") : -1]


def _math_strip(s: str) -> str:
    """The MATH benchmark's ``strip_string`` as lm-eval's aime task has it (it raises where that does)."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:
        splits = s.split("\\text{ ")
        assert len(splits) == 2
        s = splits[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    if len(s.split("=")) == 2 and len(s.split("=")[0]) <= 2:
        s = s.split("=")[1]
    if "\\sqrt" in s:
        first, *rest = s.split("\\sqrt")
        s = first + "".join("\\sqrt" + (p if p[0] == "{" else "{" + p[0] + "}" + p[1:]) for p in rest)
    s = _fix_fracs(s.replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    parts = s.split("/")
    if len(parts) == 2:
        a, b = int(parts[0]), int(parts[1])  # a ValueError here makes lm-eval compare raw strings
        if s == f"{a}/{b}":
            s = f"\\frac{{{a}}}{{{b}}}"
    return s


def _fix_fracs(s: str) -> str:
    first, *rest = s.split("\\frac")
    fixed = first
    for part in rest:
        fixed += "\\frac"
        if part[0] == "{":  # an IndexError on a trailing "\frac", as in lm-eval
            fixed += part
        elif len(part) < 2:
            return s
        elif part[1] != "{":
            fixed += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            fixed += "{" + part[0] + "}" + part[1:]
    return fixed


SCORERS: dict[str, Callable[[str, str], bool]] = {
    "qwen_math": qwen_math_grader.score,
    "math_verify": math_verify_score,
    "lm_eval": lm_eval_score,
}
"""Every AIME scorer by its ``task.scorer`` name, the reference (the default) first."""
