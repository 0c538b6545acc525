"""LiveCodeBench code generation: lcb_runner's prompts, code extraction and grading, sandboxed.

Rows follow ``livecodebench/code_generation_lite``. A program is graded in one sandboxed process
(:mod:`snapeval.sandbox`) that runs all its tests, each timed on its own, under lcb_runner's limits;
the harness judges each outcome as lcb_runner's ``testing_util`` does, outside the sandbox.

Modules: :mod:`~snapeval.tasks.livecodebench.prompts` (lcb_runner's prompt per model style),
:mod:`~snapeval.tasks.livecodebench.extraction` (the program in an output),
:mod:`~snapeval.tasks.livecodebench.cases` (a problem's tests), :mod:`~snapeval.tasks.livecodebench.grader`
(the grading loop run inside the sandbox), :mod:`~snapeval.tasks.livecodebench.grading` (one program on
one problem), :mod:`~snapeval.tasks.livecodebench.judging` (one test's verdict),
:mod:`~snapeval.tasks.livecodebench.task` (the task: data, prompts, score).
"""

from snapeval.tasks.livecodebench.cases import CodeTest, parse_tests
from snapeval.tasks.livecodebench.extraction import extract_code
from snapeval.tasks.livecodebench.grading import TestReport, run_tests
from snapeval.tasks.livecodebench.judging import Verdict, outputs_match
from snapeval.tasks.livecodebench.prompts import STYLES, SYSTEM_MESSAGE, build_messages, generic_question
from snapeval.tasks.livecodebench.task import LIVECODEBENCH, LiveCodeBench, filter_by_date, release_files

__all__ = [
    "LIVECODEBENCH",
    "STYLES",
    "SYSTEM_MESSAGE",
    "CodeTest",
    "LiveCodeBench",
    "TestReport",
    "Verdict",
    "build_messages",
    "extract_code",
    "filter_by_date",
    "generic_question",
    "outputs_match",
    "parse_tests",
    "release_files",
    "run_tests",
]
