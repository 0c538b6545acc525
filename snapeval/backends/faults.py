"""A deployed engine's failed call, said in one line: what lm-eval's client raised once its attempts were
spent, read as the HTTP status and the server's own reason, a call past the client's timeout, or a lost
connection, each with what to change.

lm-eval's HTTP clients try each call ``max_retries`` times in all (tenacity's ``stop_after_attempt``,
waiting 1 s, 1 s, 2 s, 4 s ... up to 10 s between tries, whatever the error: a 400 too), each try given
``timeout`` seconds, then raise the last error: ``requests``' (one call at a time) or ``aiohttp``'s
(``num_concurrent`` > 1). Only ``requests``' error carries the server's reason (its body); ``aiohttp``'s
carries the status alone, and lm-eval logs the body as a warning above the line. The error is looked for
along the chain of what was raised while handling what (lm-eval 0.4.10's ``aiohttp`` path raises an
``UnboundLocalError`` of its own while logging the HTTP error).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ARGUMENTS = "model.backend_args"
REASON_CHARS = 300


@dataclass(frozen=True)
class Patience:
    """How a client calls: its tries per call and seconds per try (None where it is not lm-eval's HTTP
    client, whose numbers these are)."""

    attempts: int | None = None
    timeout_s: float | None = None

    def tries(self) -> str:
        """``after 3 attempts (max_retries=3)``, or what is known of it."""
        if self.attempts is None:
            return "its retries spent"
        return f"after {self.attempts} attempt{'s' * (self.attempts != 1)} (max_retries={self.attempts})"


def failure_line(error: BaseException, patience: Patience) -> str:
    """What ``error`` (a client's, once its attempts were spent) says of the engine, and what to change."""
    chain = causes(error)
    http = next((found for cause in chain if (found := http_status(cause)) is not None), None)
    if http is not None:
        status, phrase, body = http
        reason = server_reason(body) or phrase
        return f"HTTP {status} {reason}, {patience.tries()}: {status_hint(status, reason)}"
    if any(timed_out(cause) for cause in chain):
        seconds = "" if patience.timeout_s is None else f" {patience.timeout_s:g} s"
        return (
            f"no answer within its timeout{seconds}, {patience.tries()}: raise timeout (seconds a call may "
            f"take) in {ARGUMENTS}, or give the server less to do at once (num_concurrent)"
        )
    lost = next((cause for cause in chain if connection_lost(cause)), None)
    if lost is not None:
        return (
            f"the connection failed ({one_line(lost)}), {patience.tries()}: the server stopped, or refuses "
            "connections"
        )
    return f"{type(error).__name__}: {one_line(error)}"


def causes(error: BaseException) -> list[BaseException]:
    """``error``, then what it was raised from or while handling, and so on."""
    chain = [error]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None and cause not in chain:
        chain.append(cause)
    return chain


def http_status(error: BaseException) -> tuple[int, str, str] | None:
    """An HTTP error's status, reason phrase and body (empty where the error does not carry it)."""
    try:
        import requests
    except ModuleNotFoundError:  # no HTTP client installed: lm-eval's offline models
        return None
    if isinstance(error, requests.HTTPError) and error.response is not None:
        return error.response.status_code, error.response.reason or "", error.response.text
    import aiohttp  # installed with requests by lm-eval's api extra

    if isinstance(error, aiohttp.ClientResponseError):
        return error.status, error.message or "", ""
    return None


def timed_out(error: BaseException) -> bool:
    """A call past its timeout: ``requests``' Timeout, or asyncio's (``aiohttp``'s)."""
    import requests

    return isinstance(error, TimeoutError | requests.Timeout)


def connection_lost(error: BaseException) -> bool:
    """A connection refused, reset or closed before the answer."""
    import aiohttp
    import requests

    return isinstance(error, ConnectionError | requests.ConnectionError | aiohttp.ClientConnectionError)


def server_reason(body: str) -> str:
    """The reason a server gives in an error's body: OpenAI's ``error.message`` (llama.cpp, SGLang), vLLM's
    ``message``, FastAPI's ``detail``; else the body itself; on one line."""
    try:
        found = json.loads(body)
    except ValueError:
        return one_line(body)
    if isinstance(found, dict):
        inner = found.get("error")
        for candidate in (inner.get("message") if isinstance(inner, dict) else inner, found.get("message")):
            if isinstance(candidate, str) and candidate:
                return one_line(candidate)
        if "detail" in found:
            return one_line(str(found["detail"]))
    return one_line(body)


def status_hint(status: int, reason: str) -> str:
    """What a status asks the user to change."""
    if status == 429:
        return f"the server limits its rate: raise max_retries, or lower num_concurrent, in {ARGUMENTS}"
    if status >= 500:
        return "the server failed; its log says why"
    if "context" in reason.lower():
        return "the prompt is over the server's context: serve a longer one, or lower task.context_length"
    return "the server refuses the request (a model it does not serve? an argument it does not take?)"


def one_line(error: BaseException | str) -> str:
    """``error`` on one line, at most :data:`REASON_CHARS` characters."""
    text = " ".join(str(error).split())
    return text[:REASON_CHARS] or (type(error).__name__ if isinstance(error, BaseException) else "")
