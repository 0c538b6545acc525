"""Run untrusted (model-written) Python programs, each in its own confined process.

Every program gets a fresh private working directory (deleted afterwards), a scrubbed environment
(``PATH``, ``LANG`` and a ``HOME`` inside that directory), resource limits (address space,
processes, file size, CPU time, no core dumps) and a wall-clock timeout, after which it is killed
with every process it started. Where the platform allows it (probed once, see :func:`isolation`)
the program also runs

* in private mount, network, pid and IPC namespaces: no network at all (not even loopback), a
  private ``/proc``, and every process it starts dies with it;
* on an allow-listed, read-only root: the system's libraries and the interpreter, a private ``/tmp``
  and its working folder (:mod:`~snapeval.sandbox.bootstrap`, :mod:`~snapeval.sandbox.root`);
* without capabilities and with ``no_new_privs`` (setuid binaries cannot raise privileges);
* as a uid of its own when the harness runs as root, so that its process limit is its own (the
  kernel exempts root from it, and counts it per uid).

Modules: :mod:`~snapeval.sandbox.limits` (what a run may use, and the floors a config's limits are
held to), :mod:`~snapeval.sandbox.probe` (which
isolation works here), :mod:`~snapeval.sandbox.execution` (one run: its folder, launch and result),
:mod:`~snapeval.sandbox.processes` (waiting and killing), :mod:`~snapeval.sandbox.cgroups` (a memory
cap for all of a run's processes), :mod:`~snapeval.sandbox.root` (the paths of its root) and
:mod:`~snapeval.sandbox.bootstrap` (the script that builds that root and confines the program).
"""

from snapeval.sandbox.execution import ExecutionResult, Isolation, execute
from snapeval.sandbox.limits import DEFAULT_LIMITS, SandboxLimits, limits_from_config
from snapeval.sandbox.probe import UNSAFE_ENV, isolation

__all__ = [
    "DEFAULT_LIMITS",
    "UNSAFE_ENV",
    "ExecutionResult",
    "Isolation",
    "SandboxLimits",
    "isolation",
    "limits_from_config",
    "run_program",
]


def run_program(code: str, stdin: str = "", limits: SandboxLimits = DEFAULT_LIMITS) -> ExecutionResult:
    """Run the Python program ``code`` with ``stdin`` under the strongest available isolation."""
    return execute(code, stdin, limits, isolation())
