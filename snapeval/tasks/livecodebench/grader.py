"""LiveCodeBench's grading loop, run inside the sandbox: one process per program, every test timed alone.

:func:`snapeval.tasks.livecodebench.grading.run_tests` runs this file as the sandboxed program (standard
library only; it never imports snapeval). It reads a job (the program, its function name for
functional problems, the test inputs, the per-test limit) from stdin and grades as lcb_runner's
``testing_util`` does:

* the process is set up first (lcb_runner's ``reliability_guard``, ``sys.set_int_max_str_digits(50000)``,
  an empty real stdin and stdout as in its worker processes), then the program is compiled with
  lcb_runner's implicit imports (a stdin program: its imports hoisted and the rest wrapped in a
  function, ``if __name__ == '__main__':`` unwrapped), under the per-test limit;
* each test then runs under its own limit, timing the call only, never the interpreter start-up: a
  stdin program with mocked ``sys.stdin``/``open`` and captured ``sys.stdout`` (``SystemExit`` ends
  the test normally), a functional one called with the test's JSON arguments on one ``Solution``
  instance; the limit's alarm prints lcb_runner's ``timeout occured`` line into the current stdout
  before it raises, as lcb_runner's handler does (a stdin program that swallows it fails);
* it stops at the first test that raises or runs out of time.

The expected outputs never enter the sandbox: each test's outcome (captured stdout, or the returned
value as JSON) is written on a channel to the harness, which judges it. A returned value is written
so that JSON equality in the harness is Python equality in lcb_runner (numpy scalars become Python
numbers, a numpy array is compared by the harness as numpy compares it; tuples inside a result,
non-string dict keys and values with no JSON form never equal a JSON answer), except that an object's
own ``__eq__`` is never trusted.
"""

import ast
import builtins
import contextlib
import functools
import io
import json
import numbers
import os
import signal
import sys
import time
from types import ModuleType
from unittest import mock

# lcb_runner's ``import_string``, prepended to every program.
IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
    "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
    "from builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\n"
    "import collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\n"
    "import statistics\nimport itertools\nimport functools\nimport operator\nimport io\nimport sys\n"
    "import json\nsys.setrecursionlimit(50000)\n"
)
INT_MAX_STR_DIGITS = 50000
# What lcb_runner's reliability_guard sets to None: a program that calls one of them fails there.
DISABLED = {
    "os": (
        "kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename renames "
        "truncate replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir"
    ),
    "shutil": "rmtree move chown",
    "subprocess": "Popen",
    "builtins": "quit help",
}
BLOCKED_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")
NOT_EQUAL = "\x1esnapeval:no-json-equal"  # a JSON object key no benchmark answer holds
NDARRAY = "\x1esnapeval:ndarray"  # a numpy array's items, compared by the harness as numpy compares
TIMEOUT_LINE = "timeout occured: alarm went off"  # lcb_runner's timeout_handler prints it, typo included


class TimeLimitExceeded(Exception):
    """Raised by the per-test alarm."""


def without_main_guard(code: str) -> str:
    """The program with a final ``if __name__ == '__main__':`` block replaced by its body."""
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            return ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:  # noqa: BLE001 - lcb_runner leaves any program it cannot rewrite as it is
        pass
    return code


def as_function(code: str) -> str:
    """A stdin program as lcb_runner runs it: imports at the top, every other statement inside
    ``wrapped_function()`` (so its variables are locals); unchanged if it does not parse."""
    try:
        tree = ast.parse(code)
        imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        others = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        no_args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        function = ast.FunctionDef(
            name="wrapped_function", args=no_args, body=others, decorator_list=[], lineno=-1
        )
        return IMPORTS + "\n" + ast.unparse(imports) + "\n" + ast.unparse(function)
    except Exception:  # noqa: BLE001
        return code


def json_value(value):
    """``value`` as JSON whose equality with a JSON answer is ``value == answer`` in lcb_runner."""
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, numbers.Integral):  # int subclasses and numpy integers
        return int(value)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:  # numpy scalars
        return json_value(value.item())
    if isinstance(value, list):
        return [json_value(item) for item in value]
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray":
        return {NDARRAY: json_value(value.tolist())}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: json_value(item) for key, item in value.items()}
    return {NOT_EQUAL: type(value).__name__}


class MockStdin:
    """lcb_runner's ``sys.stdin`` during a test: ``read``/``readlines`` of the whole input, a
    ``buffer`` whose ``readline`` always returns the first line, anything else from a ``StringIO``."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._stream = io.StringIO(text)
        self.buffer = MockBuffer(text)

    def read(self, *args):
        return self._text

    def readline(self, *args):
        return self._stream.readline(*args)

    def readlines(self, *args):
        return self._text.split("\n")

    def __getattr__(self, name):
        return getattr(self._stream, name)


class MockBuffer:
    def __init__(self, text: str) -> None:
        self._data = text.encode("utf-8")

    def read(self, *args):
        return self._data

    def readline(self, *args):
        return self._data.split(b"\n")[0] + b"\n"


def call_with_stdin(function, text: str) -> None:
    """Call a wrapped stdin program on ``text`` as lcb_runner's ``call_method`` does, in its patch order:
    ``read``, ``readlines`` and ``readline`` are patched on the process's real stdin (what ``from sys
    import stdin`` bound at compile time), then ``sys.stdin`` is replaced and ``open`` mocked."""
    lines = iter(text.split("\n"))
    with (
        mock.patch("sys.stdin.read", lambda *args: text),
        mock.patch("sys.stdin.readlines", lambda *args: text.split("\n")),
        mock.patch("sys.stdin.readline", lambda *args: next(lines)),
        mock.patch("sys.stdin", MockStdin(text)),
        mock.patch("builtins.open", mock.mock_open(read_data=text)),
        contextlib.suppress(SystemExit),  # an exit ends the test normally
    ):
        function()


def run_test(call, limit_s: float) -> tuple[str, object, float]:
    """``(status, result, seconds)`` of ``call()`` under the per-test alarm: status ``ok``, ``timeout``
    or ``error`` (the result is then the exception's text)."""
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    start = time.perf_counter()
    try:
        return "ok", call(), time.perf_counter() - start
    except TimeLimitExceeded:
        return "timeout", None, time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - every exception of the program is its runtime error
        return "error", f"{type(exc).__name__}: {exc}"[:1000], time.perf_counter() - start
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def compile_program(source: str) -> object:
    """The module after executing ``source`` (or its ``Solution()``), as lcb_runner's ``compile_code``."""
    module = ModuleType("tmp_sol", "")
    exec(source, module.__dict__)
    return module.Solution() if "class Solution" in source else module


def call_function(function, text: str) -> object:
    """A functional program's result on one test: newline-separated JSON arguments, tuples as lists."""
    value = function(*[json.loads(line) for line in text.split("\n")])
    return list(value) if isinstance(value, tuple) else value


def capture_stdout(function, text: str, real_stdout) -> str:
    """What a stdin program prints on ``text`` (lcb_runner's ``Capturing``, whose ``close`` takes an
    argument, so that ``sys.stdout.close()`` raises)."""
    captured = io.StringIO()
    captured.close = lambda x: 1
    sys.stdout = captured
    try:
        call_with_stdin(function, text)
    finally:
        sys.stdout = real_stdout
    return captured.getvalue()


def grade(job: dict, report, real_stdout) -> None:
    """Compile the job's program, then run its tests in order, reporting each outcome, until one raises
    or times out."""
    code, func_name, limit_s = job["code"], job["func_name"], job["timeout_s"]
    source = IMPORTS + "\n\n" + code if func_name else as_function(without_main_guard(code))
    status, compiled, seconds = run_test(lambda: compile_program(source), limit_s)
    name = func_name or "wrapped_function"
    if status == "ok" and not hasattr(compiled, name):
        status, compiled = "error", f"the program defines no {name}"
    if status != "ok":
        report({"test": 0, "status": status, "error": compiled, "seconds": seconds})
        return
    function = getattr(compiled, name)
    for index, text in enumerate(job["inputs"]):
        if func_name:
            status, value, seconds = run_test(functools.partial(call_function, function, text), limit_s)
            outcome = {"value": json_value(value)}
        else:
            run = functools.partial(capture_stdout, function, text, real_stdout)
            status, value, seconds = run_test(run, limit_s)
            outcome = {"stdout": value}
        if status != "ok":
            outcome = {"error": value} if status == "error" else {}
        report({"test": index, "status": status, "seconds": seconds, **outcome})
        if status != "ok":
            return


def guard() -> None:
    """lcb_runner's ``reliability_guard`` (no memory limit: the sandbox sets its own)."""
    import shutil
    import subprocess

    os.environ["OMP_NUM_THREADS"] = "1"
    modules = {"os": os, "shutil": shutil, "subprocess": subprocess, "builtins": builtins}
    for module, names in DISABLED.items():
        for name in names.split():
            setattr(modules[module], name, None)
    for name in BLOCKED_MODULES:
        sys.modules[name] = None


def alarm(signum: int, frame: object) -> None:
    """lcb_runner's ``timeout_handler``: its line goes to the current ``sys.stdout`` (a stdin test's
    captured output), so a program that swallows the exception and answers still fails there."""
    print(TIMEOUT_LINE)
    raise TimeLimitExceeded


def main() -> None:
    """Read the job from stdin, set the process up as lcb_runner's workers are, grade, report on the
    original stdout (the program's own stdin and stdout are empty)."""
    job = json.loads(sys.stdin.read())
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    empty = os.open(os.devnull, os.O_RDWR)
    os.dup2(empty, 0)
    os.dup2(empty, 1)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's real stdin, as in lcb_runner's workers
    real_stdout = sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    sys.set_int_max_str_digits(INT_MAX_STR_DIGITS)
    signal.signal(signal.SIGALRM, alarm)
    dumps, write, flush = json.dumps, channel.write, channel.flush

    def report(outcome: dict) -> None:
        write(dumps(outcome) + "\n")
        flush()

    with contextlib.suppress(ImportError):  # lcb_runner's grader has numpy loaded before the guard
        import numpy  # noqa: F401

    guard()
    grade(job, report, real_stdout)


if __name__ == "__main__":
    main()
