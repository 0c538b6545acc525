"""The ``engine`` group: a deployed engine that snapeval starts itself, one server per cache setting
(``engine.serve``, a command template), and how long a started server has to answer (``engine.ready_s``).

A template is a command, split as a shell would split it (no shell runs it), whose fields are filled per
server: ``{port}`` (a free port snapeval picks), ``{model}`` (``model.pretrained``) and each parameter of
the point's cache setting by name (``{method}``, ``{budget}``, ``{window}``, ...). ``{name:-default}``
fills a field that a point's setting lacks (the full cache has no budget). ``{port}`` is also filled in
``model.backend_args`` (its ``base_url``). Nothing here is stored with a result or hashed: what ran is
stored with each run (its ``engine`` column). Standard library only.
"""

from __future__ import annotations

import json
import shlex
import shutil
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from snapeval.configs.backend import SECRET_WORDS, backend_arguments, lm_eval_model
from snapeval.configs.fields import Checked, integer, optional_text, setting
from snapeval.configs.methods import METHODS, parameter_names
from snapeval.configs.setting import effective_params
from snapeval.errors import SnapevalError

FIELD = "engine.serve"
ARGUMENTS = "model.backend_args"
PORT = "port"
MODEL = "model"
PORT_FIELD = "{" + PORT + "}"
DEFAULT_MARK = "-"
"""``{budget:-4096}``: the value of a field that a point's setting lacks."""


@dataclass
class EngineConfig(Checked):
    """A server snapeval starts for each cache setting of a remote run (docs/engines.md)."""

    path = "engine"

    serve: str | None = setting(
        None,
        check=optional_text,
        stored=False,
        help="a command started per cache setting: {port}, {model}, {budget}, ... (docs/engines.md)",
    )
    ready_s: int = setting(
        600, check=integer(), stored=False, help="how long a started server has to answer /v1/models"
    )


def serve_template(config: Mapping[str, Any]) -> str | None:
    """The config's ``engine.serve`` (None where the config has no engine group: a stored one)."""
    return (config.get("engine") or {}).get("serve")


def split_command(template: str) -> list[str]:
    """The template's arguments, split as a shell splits them; one line on ``engine.serve`` if it cannot."""
    try:
        arguments = shlex.split(template)
    except ValueError as exc:
        raise SnapevalError(f"cannot split {template!r} into a command ({exc})", FIELD) from None
    if not arguments:
        raise SnapevalError("an empty command; give the command that starts the server", FIELD)
    return arguments


def fields_of(argument: str) -> list[tuple[str, str | None]]:
    """Each ``{field}`` of ``argument`` as (name, default or None); ``{{`` and ``}}`` are braces."""
    try:
        parsed = list(string.Formatter().parse(argument))
    except ValueError as exc:
        message = f"cannot read the fields of {argument!r} ({exc}; {{{{ is a brace)"
        raise SnapevalError(message, FIELD) from None
    found = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if conversion or (spec and not spec.startswith(DEFAULT_MARK)) or not name.isidentifier():
            shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            message = f"{argument!r}: a field is {{name}} or {{name:-default}}, got {{{shown}}}"
            raise SnapevalError(message, FIELD)
        found.append((name, spec.removeprefix(DEFAULT_MARK) if spec else None))
    return found


def fill(argument: str, values: Mapping[str, Any], field: str = FIELD) -> str:
    """``argument`` with its fields filled from ``values`` (a value as JSON writes it, a string as is)."""
    out = []
    for literal, name, spec, _ in string.Formatter().parse(argument):
        out.append(literal)
        if name is None:
            continue
        if name in values:
            value = values[name]
            out.append(value if isinstance(value, str) else json.dumps(value))
        elif spec:
            out.append(spec.removeprefix(DEFAULT_MARK))
        else:
            raise SnapevalError(f"no value for {{{name}}} in {argument!r}", field)
    return "".join(out)


def serve_values(port: int, config: Mapping[str, Any], cache: Mapping[str, Any]) -> dict[str, Any]:
    """What a server's template is filled with: its port, the model's weights and the setting's fields."""
    return {**cache, MODEL: config["model"]["pretrained"], PORT: port}


def serve_command(template: str, values: Mapping[str, Any]) -> list[str]:
    """The command of one server: the template split, each argument filled."""
    return [fill(argument, values) for argument in split_command(template)]


def served_arguments(backend_args: str | None, port: int) -> str | None:
    """``model.backend_args`` with ``{port}`` filled (the port of the server its client talks to)."""
    return None if backend_args is None else backend_args.replace(PORT_FIELD, str(port))


def check_engine(config: Mapping[str, Any], caches: Sequence[Mapping[str, Any]]) -> None:
    """Refuse, before anything loads, an ``engine.serve`` that could not start the servers of the settings
    ``caches`` (a run's cache nodes): no remote ``model.backend``, a command that does not split, a field
    no setting has (or one that a setting lacks, with no default), no ``{port}`` in the command or in
    ``base_url``, a secret, a program not on PATH; and a ``{port}`` in ``base_url`` without a server."""
    template, model = serve_template(config), config["model"]
    base_url = backend_arguments(model.get("backend_args")).get("base_url") or ""
    if template is None:
        if PORT_FIELD in (model.get("backend_args") or ""):
            raise SnapevalError(
                f"{PORT_FIELD} is the port of a server snapeval starts: set engine.serve, or give the port",
                ARGUMENTS,
            )
        return
    if lm_eval_model(model.get("backend")) is None:
        raise SnapevalError(
            "starts a deployed engine's server: give model.backend=lm_eval:<model> too "
            "(lm_eval:local-completions for an OpenAI-compatible server)",
            FIELD,
        )
    arguments = split_command(template)
    check_fields(arguments, [stored_cache(cache) for cache in caches])
    if not any(PORT_FIELD in argument for argument in arguments):
        raise SnapevalError(f"the command takes no {PORT_FIELD}: the server must listen where told", FIELD)
    if PORT_FIELD not in base_url:
        raise SnapevalError(
            f"base_url must take {PORT_FIELD}, the port of the server engine.serve starts "
            f"(base_url=http://127.0.0.1:{PORT_FIELD}/v1/completions)",
            ARGUMENTS,
        )
    filled = urlsplit(served_arguments(base_url, 1) or "")
    if filled.scheme not in ("http", "https") or not filled.hostname:
        raise SnapevalError(f"base_url {base_url!r} is not an http(s) URL", ARGUMENTS)
    check_no_secret(arguments)
    program = arguments[0]
    if "{" not in program and shutil.which(program) is None:
        raise SnapevalError(f"no program {program!r} on PATH (the command's first word)", FIELD)


def stored_cache(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """A setting as a run stores it (its fields a server's template takes); the node as given where its
    parameters are impossible (the plan sets that point aside)."""
    try:
        return effective_params(node)
    except SnapevalError:
        return node


def check_fields(arguments: Iterable[str], caches: Sequence[Mapping[str, Any]]) -> None:
    """Every field of the template is ``{port}``, ``{model}`` or a field of each setting, or of some
    method's with a default for the settings that lack it."""
    known = {PORT, MODEL}
    settings = sorted({name for cache in caches for name in cache})
    for argument in arguments:
        for name, default in fields_of(argument):
            if name in known:
                continue
            if not any(name in cache for cache in caches) and name not in method_fields():
                offered = ", ".join("{" + item + "}" for item in [PORT, MODEL, *settings])
                raise SnapevalError(f"unknown field {{{name}}}; a template takes {offered}", FIELD)
            lacking = next((cache for cache in caches if name not in cache), None)
            if lacking is not None and default is None:
                raise SnapevalError(
                    f"{{{name}}}: cache {lacking.get('method')} has no {name}; give a default for it, "
                    f"{{{name}:-<value>}}",
                    FIELD,
                )


def method_fields() -> set[str]:
    """The fields of every built-in method's setting (a defaulted one may be in none of a run's)."""
    return {"method"} | {name for params in METHODS.values() for name in parameter_names(params)}


def check_no_secret(arguments: Iterable[str]) -> None:
    """Refuse an option that passes a secret (``--api-key``, ``--hf-token``): the command is stored."""
    for argument in arguments:
        option = argument.partition("=")[0]
        words = option.lstrip("-").replace("_", "-").lower().split("-")
        if option.startswith("-") and words[-1] in SECRET_WORDS:
            raise SnapevalError(
                f"{option} passes a secret, and the command is stored with the run: let the server read "
                "it from its environment variable",
                FIELD,
            )
