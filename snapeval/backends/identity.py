"""What a deployed engine says about itself, stored with each of its runs (the ``runs.engine`` column): the
backend and its arguments, the server's ``/v1/models`` answer, its version where it gives one (its
``Server`` header, its ``/version`` answer), the serve command as run and its log. A secret never enters
it: arguments that name one are refused (:mod:`snapeval.configs.backend`), and the value of any
environment variable whose name says it holds one is blanked wherever a server echoes it. Standard
library only.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from snapeval.configs.backend import SECRET_WORDS, backend_arguments

MODELS_PATH = "/v1/models"
VERSION_PATH = "/version"
ASK_S = 5.0
KEY_VARIABLE = "OPENAI_API_KEY"
"""The key lm-eval's OpenAI-compatible clients send; sent here too, never stored."""
SHORTEST_SECRET = 4
"""A secret variable's value shorter than this is not looked for (it would blank common words)."""


@dataclass(frozen=True)
class Reply:
    """A server's answer to a GET: its status, its ``Server`` header and its body as text."""

    status: int
    server: str | None
    text: str

    def json(self) -> Any:
        """The body as JSON; None where it is not JSON."""
        try:
            return json.loads(self.text)
        except ValueError:
            return None


def server_root(base_url: str) -> str:
    """The server of a client's ``base_url``: its scheme and address, and its path up to ``/v1``
    (``http://h:8000/v1/completions`` -> ``http://h:8000``)."""
    parts = urlsplit(base_url)
    path = parts.path.partition("/v1")[0] if "/v1" in parts.path else ""
    return urlunsplit((parts.scheme, parts.netloc, path.rstrip("/"), "", ""))


def models_url(backend_args: str | None) -> str | None:
    """Where the server of ``model.backend_args`` lists its models; None without a ``base_url``."""
    base_url = backend_arguments(backend_args).get("base_url")
    return server_root(base_url) + MODELS_PATH if base_url else None


def ask(url: str, timeout: float = ASK_S) -> Reply | None:
    """GET ``url`` (with the client's key, if set); None when nothing answers."""
    request = urllib.request.Request(url)
    if key := os.environ.get(KEY_VARIABLE):
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode(errors="replace")
            return Reply(response.status, response.headers.get("Server"), text)
    except urllib.error.HTTPError as error:
        return Reply(error.code, error.headers.get("Server"), "")
    except (OSError, ValueError):  # refused, timed out, reset; a URL urllib cannot open
        return None


def engine_identity(
    backend: str,
    backend_args: str | None,
    serve: str | None = None,
    log: str | None = None,
    models: Reply | None = None,
) -> dict[str, Any]:
    """The identity stored with a run of ``backend``: ``models`` is the ``/v1/models`` reply where it is
    already known (a started server's), else the server is asked."""
    base_url = backend_arguments(backend_args).get("base_url")
    root = server_root(base_url) if base_url else None
    if models is None and root is not None:
        models = ask(root + MODELS_PATH)
    version = ask(root + VERSION_PATH) if root is not None else None
    found = version.json() if version is not None and version.status == 200 else None
    listed = models.json() if models is not None and models.status == 200 else None
    identity = {
        "backend": backend,
        "backend_args": backend_args,
        "models": listed,
        "version": found.get("version") if isinstance(found, dict) else found,
        "server": models.server if models is not None else None,
        "serve": serve,
        "log": log,
        "note": unlisted_model(backend_arguments(backend_args).get("model"), listed),
    }
    return without_secrets(identity)


def unlisted_model(model: str | None, listed: Any) -> str | None:
    """A note where the server's ``/v1/models`` lists models and ``model`` (the name its client sends) is
    none of them: llama-cpp-python's server answers any name with the model it serves, vLLM and SGLang
    refuse it (HTTP 404); None where it is listed, or nothing is known."""
    data = listed.get("data") if isinstance(listed, dict) else None
    ids = [entry.get("id") for entry in data or () if isinstance(entry, dict)]
    if model is None or not ids or model in ids:
        return None
    shown = ", ".join(repr(name) for name in ids[:3]) + (", ..." if len(ids) > 3 else "")
    return (
        f"the server lists no model {model!r} (it lists {shown}): a server that answers anyway (llama.cpp) "
        "answers with the model it serves; give model= as the server lists it"
    )


def without_secrets(identity: dict[str, Any]) -> dict[str, Any]:
    """``identity`` with the value of every environment variable named as a secret's blanked."""
    text = json.dumps(identity)
    for name, value in os.environ.items():
        words = name.lower().split("_")
        if any(word in SECRET_WORDS for word in words) and len(value) >= SHORTEST_SECRET:
            text = text.replace(json.dumps(value)[1:-1], f"<${name}>")
    return json.loads(text)
