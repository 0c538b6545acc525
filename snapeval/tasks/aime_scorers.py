"""The AIME scorers of the official harnesses, each giving its original's verdict on any output (but
where a deviation of the Qwen2.5-Math grader, :data:`~snapeval.tasks.qwen_math_grader.DEVIATIONS`, says
otherwise):

* ``qwen_math``: Qwen2.5-Math's evaluation (:mod:`snapeval.tasks.qwen_math_grader`), the reference of
  the README and of R-KV's AIME numbers;
* ``math_verify``: Hugging Face's math-verify, the library itself: ``verify(parse(gold), parse(output))``;
* ``lm_eval``: lm-eval's ``aime24`` task itself, its ``process_results`` (``lm_eval/tasks/aime/utils.py``):
  the content of the last ``\\boxed``, else the text between the first and last ``$`` (else the whole
  output), compared after MATH's ``strip_string``.

The names are :data:`~snapeval.configs.task.AIME_SCORERS`; the scorer of a name is this module's
``<name>_score``. ``tests/data/aime_probes.json`` holds each original's verdicts on answer strings, and
the tests hold every scorer to them (``qwen_math`` to all but the probes its deviations explain).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType

from math_verify import parse, verify

from snapeval.configs.task import AIME_SCORERS
from snapeval.tasks import qwen_math_grader

_MATH_VERIFY_TIMEOUT_S = 5


def qwen_math_score(output: str, gold: str) -> bool:
    """Qwen2.5-Math's verdict (:func:`snapeval.tasks.qwen_math_grader.score`)."""
    return qwen_math_grader.score(output, gold)


def math_verify_score(output: str, gold: str) -> bool:
    """math-verify's verdict (its timeouts use SIGALRM, which only the main thread may install)."""
    timeout = _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(gold, parsing_timeout=timeout)
    return bool(verify(gold_parsed, parse(output, parsing_timeout=timeout), timeout_seconds=timeout))


def lm_eval_score(output: str, gold: str) -> bool:
    """lm-eval ``aime24``'s verdict (its ``exact_match``), imported on first use: ``lm_eval.tasks`` loads
    the datasets library."""
    from lm_eval.tasks.aime.utils import process_results

    return process_results({"answer": gold}, [output])["exact_match"] == 1


SCORERS: Mapping[str, Callable[[str, str], bool]] = MappingProxyType(
    {name: globals()[f"{name}_score"] for name in AIME_SCORERS}
)
"""Every AIME scorer by its ``task.scorer`` name, the reference (the default) first."""
