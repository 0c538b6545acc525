"""Who answers a run's requests (``model.backend``): snapeval's own engine, or a deployed engine through
one of lm-eval's model clients (``lm_eval:<model name>``, e.g. ``lm_eval:local-completions`` for any
OpenAI-compatible server: vLLM, SGLang, TensorRT-LLM, llama.cpp), with lm-eval's model arguments
(``model.backend_args="base_url=...,model=...,num_concurrent=8"``, as its ``--model_args`` takes them).

Secrets never enter a config: an argument whose name says it holds one (``api_key``, ``auth_token``, ...)
is refused; lm-eval's clients read keys from their environment variables. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

SNAPEVAL = "snapeval"
LM_EVAL_PREFIX = "lm_eval:"
SECRET_WORDS = ("key", "token", "secret", "password")
"""An argument named one of these, or ending in ``_<word>`` (``api_key``, ``auth_token``), holds a secret."""
TEXT_PROMPTS = {"tokenizer_backend": "none", "tokenized_requests": "False"}
"""What a remote run adds to lm-eval's arguments unless given: prompts sent as text (snapeval's own, chat
template applied), counted with the model config's tokenizer, not the server's."""


def lm_eval_model(backend: str | None) -> str | None:
    """The lm-eval model name of ``backend`` (``lm_eval:<name>``); None for snapeval's own engine."""
    if backend in (None, SNAPEVAL):
        return None
    return backend.removeprefix(LM_EVAL_PREFIX)


def backend_check(value: Any) -> str | None:
    """``model.backend``: null or ``snapeval``, or ``lm_eval:<model name>``."""
    if value in (None, SNAPEVAL):
        return None
    if isinstance(value, str) and value.startswith(LM_EVAL_PREFIX) and value.removeprefix(LM_EVAL_PREFIX):
        return None
    return "snapeval, or lm_eval:<an lm-eval model name> (lm_eval:local-completions for a server)"


def backend_arguments(value: str | None) -> dict[str, str]:
    """``k=v,k=v`` as a mapping, as lm-eval's ``--model_args`` reads it; a ValueError naming what is wrong."""
    if not value:
        return {}
    pairs = {}
    for part in value.split(","):
        key, equals, item = part.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"k=v,k=v ({part!r} is no k=v)")
        name = key.strip().lower()
        if name in SECRET_WORDS or name.endswith(tuple(f"_{word}" for word in SECRET_WORDS)):
            raise ValueError(
                f"k=v,k=v with no secret in it ({key.strip()}: give it in the environment variable the "
                "lm-eval client reads, e.g. OPENAI_API_KEY)"
            )
        pairs[key.strip()] = item.strip()
    return pairs


def backend_args_check(value: Any) -> str | None:
    """``model.backend_args``: null, or ``k=v,k=v`` with no secret."""
    if value is None:
        return None
    if not isinstance(value, str):
        return "k=v,k=v (lm-eval's model arguments)"
    try:
        backend_arguments(value)
    except ValueError as exc:
        return str(exc)
    return None


def client_arguments(value: str | None) -> dict[str, str]:
    """The arguments the lm-eval client is made with: the user's, over :data:`TEXT_PROMPTS`."""
    return {**TEXT_PROMPTS, **backend_arguments(value)}


QUOTED_KEYS = ("model.backend_args", "engine.serve")
"""Overrides whose values are written as their tools write them (``k=v,k=v``; a command with ``{port}``),
which Hydra's grammar would read as its own (``=``, ``,`` a sweep, ``{`` a mapping)."""


def quote_arguments(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with the values of :data:`QUOTED_KEYS` quoted for Hydra (a quote, and a backslash
    before one or at the end, escaped); one already quoted is left as it is."""
    quoted = []
    for override in overrides:
        key, equals, value = override.partition("=")
        if key.lstrip("+") in QUOTED_KEYS and equals and value[:1] not in ("'", '"', ""):
            escaped = re.sub(r"(\\*)'", lambda match: match[1] * 2 + "\\'", value)
            escaped = re.sub(r"(\\+)$", lambda match: match[1] * 2, escaped)
            override = f"{key}='{escaped}'"
        quoted.append(override)
    return quoted
