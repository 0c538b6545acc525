"""Which isolation works on this machine, probed once by running a program through it."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

from snapeval.errors import SnapevalError
from snapeval.sandbox.execution import Isolation, LauncherFailed, execute
from snapeval.sandbox.limits import DEFAULT_LIMITS

UNSAFE_ENV = "SNAPEVAL_UNSAFE_SANDBOX"
"""Set to 1 to run model-written code where no namespace isolation is available (unsafe)."""

NAMESPACE_FLAGS = ("--mount", "--net", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc")
_PROBE = "import os, sys; print(sys.executable); sys.exit(0 if os.access(sys.executable, os.X_OK) else 1)"


@functools.cache
def isolation() -> Isolation:
    """Probe (once) the strongest isolation that works here, trying in order:

    1. as root: ``unshare`` namespaces, each program as a uid of its own;
    2. ``unshare`` inside an unprivileged user namespace (programs keep the harness's uid);
    3. resource limits only, and only with :data:`UNSAFE_ENV` set (as root, each program then runs as
       a fresh uid whose processes are all killed when it ends).

    A launcher that cannot create its namespaces moves on to the next; a sandbox whose namespaces
    exist but whose setup fails (a mount, a path) raises that error as it is. Programs always run in
    the interpreter snapeval runs in (``sys.executable``, with its site-packages): a machine where
    the sandbox cannot run it is an error, never another Python.
    """
    unavailable = []
    for wrapper, fresh_uids in _candidate_wrappers():
        candidate = Isolation(wrapper, fresh_uids, sys.executable)
        if not candidate.namespaces and os.environ.get(UNSAFE_ENV) != "1":
            raise _namespaces_unavailable(unavailable)
        try:
            result = execute(_PROBE, "", DEFAULT_LIMITS, candidate)
        except LauncherFailed as exc:
            if _creates_namespaces(wrapper):  # it failed for another reason: that reason is the error
                raise SnapevalError(str(exc)) from None
            unavailable.append(str(exc).removeprefix("sandbox setup failed: "))
            continue
        if result.status == "ok" and result.stdout.strip() == sys.executable:
            return candidate
        reason = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise SnapevalError(
            f"the sandbox cannot run this interpreter ({sys.executable}){_as_whom(candidate)}: {reason}; "
            "model-written code is graded only by the interpreter snapeval runs in"
        )
    raise _namespaces_unavailable(unavailable)


def _namespaces_unavailable(reasons: list[str]) -> SnapevalError:
    why = f" ({'; '.join(reasons)})" if reasons else " (unshare is not installed)"
    return SnapevalError(
        f"unshare cannot create the sandbox's namespaces here{why}, so model-written code will not run; "
        f"set {UNSAFE_ENV}=1 to run it anyway, without isolation (unsafe: it can read your files, "
        "reach the network and outlive the run)",
        UNSAFE_ENV,
    )


def _creates_namespaces(wrapper: tuple[str, ...]) -> bool:
    """Whether ``wrapper`` can create its namespaces and run ``true`` in them."""
    if not wrapper:
        return False
    return subprocess.run([*wrapper, "true"], capture_output=True, timeout=30, check=False).returncode == 0


def _as_whom(candidate: Isolation) -> str:
    return " as an unprivileged user" if candidate.fresh_uids else ""


def _candidate_wrappers() -> Iterator[tuple[tuple[str, ...], bool]]:
    root = os.geteuid() == 0
    unshare = shutil.which("unshare")
    if unshare and root:
        yield (unshare, *NAMESPACE_FLAGS), True
    if unshare:
        yield (unshare, "--user", "--map-root-user", *NAMESPACE_FLAGS), False
    yield (), root
