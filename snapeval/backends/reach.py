"""A deployed engine's address checked before anything loads: a ``base_url`` that nothing answers at ends
the run in one line naming it, not in the client's retries and traceback. Standard library only."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from snapeval.configs.backend import backend_arguments
from snapeval.errors import SnapevalError

FIELD = "model.backend_args"
CONNECT_S = 5.0


def check_reachable(backend_args: str | None) -> None:
    """Refuse a ``base_url`` whose host and port take no connection within :data:`CONNECT_S`."""
    url = backend_arguments(backend_args).get("base_url")
    if not url:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SnapevalError(f"base_url {url!r} is not an http(s) URL", FIELD)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise SnapevalError(f"base_url {url!r} has no valid port", FIELD) from None
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SnapevalError(
            f"nothing answers at base_url {url} ({reason}): start the server, or give its address", FIELD
        ) from None
