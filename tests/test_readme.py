"""The README and the reference pages under ``docs/`` say what the code does: every ``python -m snapeval ...``
command in them composes into the config it claims, the README's engine example runs, the numbered trace of
``+exp=aime_budget_sweep`` in ``docs/layout.md`` is exactly every file that sweep executes (measured by
:mod:`tests.trace`), and the pages stay short enough to read: README.md at most 250 lines, each docs page
at most 200, no line over 120 characters outside tables."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from snapeval.configs.backend import QUOTED_KEYS
from snapeval.paths import CONF_DIR
from tests.families import FAMILIES

from .conftest import TINY_VOCAB, composed_sweep

ROOT = CONF_DIR.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
COMMAND = re.compile(r"^(?:\w+=\S+ )*python -m snapeval (.+?)(?:\s+#.*)?$", re.MULTILINE)
CONTINUED = re.compile(r"\\\n\s*")  # a shell line continued on the next one


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def documented_commands() -> list[tuple[str, str]]:
    """(page, arguments) of every ``python -m snapeval ...`` line of the README and the docs pages, a
    command continued over lines (``\\``) read as one line."""
    return [
        (page_name(page), arguments)
        for page in PAGES
        for arguments in COMMAND.findall(CONTINUED.sub(" ", page.read_text()))
    ]


def section(heading: str) -> str:
    """The text under ``heading`` (a line of its own, ``## ...``), up to the next heading of its level or
    above, in whichever page holds it: the README or a docs page."""
    level = heading.split(" ", 1)[0]
    found = []
    for page in PAGES:
        text = page.read_text()
        match = re.search(rf"^{re.escape(heading)}\n", text, re.MULTILINE)
        if match:
            rest = text[match.end() :]
            end = re.search(rf"^#{{1,{len(level)}}} ", rest, re.MULTILINE)
            found.append(rest[: end.start()] if end else rest)
    assert len(found) == 1, f"{heading!r} is in {len(found)} pages"
    return found[0]


def test_the_pages_show_evaluation_commands():
    assert len(documented_commands()) >= 10


GROUP_NAMES = {"task": "name", "model": "name", "cache": "method", "protocol": "name", "hardware": "name"}


def configured(config: dict, override: str) -> bool:
    """Whether ``config`` holds what ``override`` (``key=value``, ``group=option``, ``+group=option``)
    asks for; a multirun list (``a,b``) holds if any of its values does."""
    key, _, value = override.lstrip("+").partition("=")
    path = key.split(".")
    if len(path) == 1 and path[0] in GROUP_NAMES:
        path = [path[0], GROUP_NAMES[path[0]]]
    for part in path:
        if not isinstance(config, dict) or part not in config:
            return False
        config = config[part]
    if key in QUOTED_KEYS:  # lm-eval's k=v,k=v, a serve command: one value, never a multirun list
        return config == value
    return any(str(config) == choice or config == yaml.safe_load(choice) for choice in value.split(","))


@pytest.mark.parametrize(
    "arguments",
    [pytest.param(arguments, id=f"{page}: {arguments}") for page, arguments in documented_commands()],
)
def test_documented_command_composes_to_what_it_says(arguments):
    overrides = [o for o in shlex.split(arguments) if o != "-m"]  # -m: multirun; the points compose alike
    experiment = next((o.split("=", 1)[1] for o in overrides if o.startswith("+exp=")), None)
    rest = [o for o in overrides if not o.startswith("+exp=")]
    points = composed_sweep(experiment, *rest)
    assert points
    gridded = len({yaml.safe_dump(point["cache"]) for point in points}) > 1
    for override in rest:
        if override.lstrip("+").startswith("grid.") or (gridded and override.startswith("cache")):
            continue  # a grid's points set the cache themselves
        if override.startswith(("hydra", "~")):
            continue  # Hydra's own settings (a launcher), a key removed: composing them is the check
        assert any(configured(point, override) for point in points), override


# --- the pages themselves ------------------------------------------------------------------------------

MAX_LINES = {"README.md": 250}
MAX_DOCS_LINES = 200
MAX_WIDTH = 120


def test_the_pages_are_short_and_no_line_outside_a_table_is_wide():
    long_pages = {
        page_name(page): lines
        for page in PAGES
        if (lines := len(page.read_text().splitlines())) > MAX_LINES.get(page_name(page), MAX_DOCS_LINES)
    }
    assert not long_pages, long_pages
    wide = [
        f"{page_name(page)}:{number} ({len(line)} characters)"
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if len(line) > MAX_WIDTH and not line.lstrip().startswith("|")
    ]
    assert not wide, wide


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``: lower case, punctuation dropped, spaces to ``-``."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_the_readme_links_every_docs_page_and_every_relative_link_resolves():
    assert DOCS, "no docs/*.md"
    targets = {(README.parent / link.split("#")[0]).resolve() for link in LINK.findall(README.read_text())}
    assert not [page_name(page) for page in DOCS if page.resolve() not in targets]
    broken = []
    for page in PAGES:
        for link in LINK.findall(page.read_text()):
            if "://" in link:
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path) if path else page
            if not target.exists() or (anchor and target.suffix == ".md" and anchor not in anchors(target)):
                broken.append(f"{page_name(page)}: {link}")
    assert not broken, broken


# --- the trace of a sweep ------------------------------------------------------------------------------

TRACE = "## The trace of a sweep"
TRACE_ITEM = re.compile(r"^(\d+)\. `([^`]+)`:", re.MULTILINE)
TRACE_COUNT = re.compile(r"\brun (\d+) files\b")


def documented_trace() -> list[str]:
    """The files of the numbered trace under :data:`TRACE`, in order; its numbers must run 1, 2, ..."""
    items = TRACE_ITEM.findall(section(TRACE))
    assert [int(number) for number, _ in items] == list(range(1, len(items) + 1)), "numbered 1, 2, ..."
    return [name for _, name in items]


def stated_trace_count() -> int:
    """The number of files the trace's text says the sweep runs."""
    counts = TRACE_COUNT.findall(section(TRACE))
    assert len(counts) == 1, counts
    return int(counts[0])


def trace_difference(listed: list[str], executed: list[str]) -> dict[str, list[str]]:
    """How a listed trace differs from the executed files: files that ran but are not listed, listed
    files that did not run, and files listed twice."""
    return {
        "ran, not listed": sorted(set(executed) - set(listed)),
        "listed, did not run": sorted(set(listed) - set(executed)),
        "listed twice": sorted({name for name in listed if listed.count(name) > 1}),
    }


def test_the_trace_comparison_finds_every_kind_of_difference():
    executed = ["snapeval/a.py", "snapeval/b.py", "conf/config.yaml"]
    assert trace_difference(
        ["snapeval/b.py", "snapeval/b.py", "conf/config.yaml", "snapeval/c.py"], executed
    ) == {
        "ran, not listed": ["snapeval/a.py"],
        "listed, did not run": ["snapeval/c.py"],
        "listed twice": ["snapeval/b.py"],
    }
    assert not any(
        trace_difference(["conf/config.yaml", "snapeval/b.py", "snapeval/a.py"], executed).values()
    )


def test_the_trace_states_its_true_length_and_names_the_sweep():
    listed = documented_trace()
    assert stated_trace_count() == len(listed)
    assert "snapeval/tasks/aime24.py" in listed and "conf/exp/aime_budget_sweep.yaml" in listed


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    from .trace import measure

    return measure(tmp_path_factory.mktemp("trace"))


def test_the_documented_trace_is_exactly_every_file_the_sweep_executes(executed):
    """``+exp=aime_budget_sweep`` (one problem, a tiny random model) and its figures, run under a trace:
    the numbered list of ``docs/layout.md`` is every file that ran, each once, and its stated count is
    their number."""
    listed = documented_trace()
    difference = trace_difference(listed, list(executed))
    assert not any(difference.values()), {kind: names for kind, names in difference.items() if names}
    assert stated_trace_count() == len(executed)


# --- the engine example --------------------------------------------------------------------------------


def test_the_readme_engine_example_runs_and_a_cache_holding_the_prompt_equals_plain_generate(tiny_llama):
    """The Python block under "The cache engine", run as written on a tiny Llama: ``SnapStreamCache(budget=
    1024)`` holds a 40-token prompt whole, so its tokens are plain transformers' (on every supported
    transformers: ``.ci/run`` runs this at both ends of the range)."""
    import torch

    code = re.search(r"```python\n(.*?)```", section("## The cache engine"), re.DOTALL).group(1)
    model, reference = FAMILIES["llama"](TINY_VOCAB), FAMILIES["llama"](TINY_VOCAB)
    model.generation_config.eos_token_id = reference.generation_config.eos_token_id = None
    input_ids = torch.arange(3, 43)[None]
    namespace = {"model": model, "input_ids": input_ids}
    exec(code.replace("max_new_tokens=256", "max_new_tokens=12"), namespace)
    expected = reference.generate(input_ids, max_new_tokens=12, do_sample=False)
    assert namespace["out"].shape == (1, 52)
    assert torch.equal(namespace["out"], expected)
