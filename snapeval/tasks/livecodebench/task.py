"""The LiveCodeBench task: its data (releases, a contest-date window), prompts and score."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import date, datetime
from typing import Any

from snapeval.decode.stops import cut_at_stop
from snapeval.errors import SnapevalError
from snapeval.sandbox import limits_from_config
from snapeval.tasks.base import DataSource, Task
from snapeval.tasks.livecodebench.cases import tests_problem
from snapeval.tasks.livecodebench.extraction import extract_code
from snapeval.tasks.livecodebench.grading import run_tests
from snapeval.tasks.livecodebench.prompts import STYLES, SYSTEM_MESSAGE, build_messages, generic_question
from snapeval.tasks.rows import local_file

LIVECODEBENCH = DataSource(
    name="LiveCodeBench",
    hub_id="livecodebench/code_generation_lite",
    hub_split="test",
    local_path="livecodebench/code_generation_lite_v5_public.jsonl",
    required=("question_content", "platform", "question_id", "contest_date", "public_test_cases"),
)

HUB_FILES = "hf://datasets/livecodebench/code_generation_lite/{name}.jsonl"
RELEASES = 6  # release_v1 .. release_v6, each the union of the files up to it


def release_files(release: str) -> tuple[str, ...]:
    """The Hub files of a release, as lcb_runner's ``version_tag``: ``release_vN`` is every problem up
    to version N (``test.jsonl``, ``test2.jsonl`` ... ``testN.jsonl``; release_v5 holds 880 problems),
    ``vN`` only those new in version N."""
    kind, _, number = release.rpartition("v")
    if kind not in ("release_", "") or not number.isdigit() or not 1 <= int(number) <= RELEASES:
        raise ValueError(
            f"unknown release {release!r}; choose release_v1 .. release_v{RELEASES} or v1 .. v{RELEASES}"
        )
    versions = range(1, int(number) + 1) if kind else [int(number)]
    return tuple(HUB_FILES.format(name="test" if v == 1 else f"test{v}") for v in versions)


def filter_by_date(
    rows: Iterable[Mapping[str, Any]], start: str | date | None = None, end: str | date | None = None
) -> list[Mapping[str, Any]]:
    """Rows with ``start <= contest_date <= end``; a bare date means its midnight, as in lcb_runner."""
    low, high = _as_datetime(start), _as_datetime(end)
    return [
        row
        for row in rows
        if (low is None or low <= _as_datetime(row["contest_date"]))
        and (high is None or _as_datetime(row["contest_date"]) <= high)
    ]


def _is_date(value: Any) -> bool:
    try:
        _as_datetime(value)
    except (TypeError, ValueError):
        return False
    return True


def _as_datetime(value: str | date | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    return datetime.fromisoformat(value)


class LiveCodeBench(Task):
    """LiveCodeBench code generation; ``passed`` (1 when the program passes every test; its mean over samples
    is pass@1) overall and per platform (AtCoder, LeetCode).

    Config: ``prompt_style`` (lcb_runner's prompt for the model's style, see
    :mod:`~snapeval.tasks.livecodebench.prompts`; by default the model's ``prompt_style``), ``stop``
    (strings that end generation, as lcb_runner's vLLM ``stop``; the text from the first one on is
    not scored). Metadata: ``release`` (``release_v5``; the Hub files read), ``start_date``/``end_date`` (a
    contest-date window), ``code_extraction`` (``official`` or ``lenient``, see :func:`extract_code`),
    ``data_path`` (a local copy, taken whole).
    """

    names = ("livecodebench",)
    metrics = ("passed", "passed_atcoder", "passed_leetcode")
    system_message = SYSTEM_MESSAGE
    id_field = "question_id"
    source = LIVECODEBENCH
    deviations = ("json_comparison",)  # a returned value is compared as JSON, whatever the preset

    def __init__(self, cfg: Mapping[str, Any], seed: int = 0, limit: int | None = None) -> None:
        super().__init__(cfg, seed, limit)
        self.prompt_style: str = self.config["prompt_style"]
        if self.prompt_style not in STYLES:
            message = f"unknown prompt style {self.prompt_style!r}; choose one of {', '.join(STYLES)}"
            raise SnapevalError(message, "task.prompt_style")
        stop = cfg.get("stop") or []
        if not isinstance(stop, list | tuple) or not all(isinstance(text, str) and text for text in stop):
            raise SnapevalError(f"must be a list of non-empty strings, got {stop!r}", "task.stop")
        self.stop: tuple[str, ...] = tuple(stop)
        self.limits = limits_from_config(cfg.get("sandbox") or {}, "task.sandbox")

    def rows(self, tokenizer=None) -> list[dict]:
        release = self.metadata["release"]
        try:
            source = replace(LIVECODEBENCH, hub_data_files=release_files(release))
        except ValueError as exc:
            raise SnapevalError(str(exc), "task.metadata.release") from None
        data_path = self.metadata.get("data_path")
        rows = filter_by_date(
            self.data_rows(source), self.metadata.get("start_date"), self.metadata.get("end_date")
        )
        path = local_file(source, data_path)
        where = f"{path}, a local copy taken whole" if path else f"{source.hub_id} {release}"
        print(f"LiveCodeBench: {len(rows)} problems loaded from {where}", file=sys.stderr)
        return rows

    def row_problem(self, row: Mapping[str, Any]) -> str | None:
        if (self.metadata.get("start_date") or self.metadata.get("end_date")) and not _is_date(
            row["contest_date"]
        ):
            return f"contest_date: not an ISO date, got {str(row['contest_date'])[:40]!r}"
        return tests_problem(row)

    def user_text(self, row) -> str:
        return generic_question(row)

    def messages(self, row) -> list[dict[str, str]]:
        return build_messages(row, self.prompt_style)

    def target(self, row) -> str:
        return ""

    def score_row(self, row, output: str) -> dict[str, float]:
        code = extract_code(cut_at_stop(output, self.stop), self.metadata["code_extraction"])
        passed = float(run_tests(code, row, self.limits).passed)
        return {"passed": passed, f"passed_{row['platform']}": passed}
