"""The README says what the code does: every ``python -m snapeval ...`` command in it composes into the
config it claims, and its numbered trace of ``+exp=aime_budget_sweep`` is what that sweep executes (measured
by :mod:`tests.trace`), less the helpers named here with their reasons."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from snapeval.paths import CONF_DIR
from tests.families import FAMILIES

from .conftest import TINY_VOCAB, composed_sweep

README = CONF_DIR.parent / "README.md"
COMMAND = re.compile(r"^(?:\w+=\S+ )*python -m snapeval (.+?)(?:\s+#.*)?$", re.MULTILINE)


def readme_commands() -> list[str]:
    return COMMAND.findall(README.read_text())


def test_the_readme_shows_evaluation_commands():
    assert len(readme_commands()) >= 10


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
    return any(str(config) == choice or config == yaml.safe_load(choice) for choice in value.split(","))


@pytest.mark.parametrize("arguments", readme_commands())
def test_readme_command_composes_to_what_it_says(arguments):
    overrides = [o for o in shlex.split(arguments) if o != "-m"]  # -m: multirun; the points compose alike
    experiment = next((o.split("=", 1)[1] for o in overrides if o.startswith("+exp=")), None)
    rest = [o for o in overrides if not o.startswith("+exp=")]
    points = composed_sweep(experiment, *rest)
    assert points
    gridded = len({yaml.safe_dump(point["cache"]) for point in points}) > 1
    for override in rest:
        if override.startswith("grid.") or (gridded and override.startswith("cache")):
            continue  # a grid's points set the cache themselves
        if override.startswith(("hydra", "~")):
            continue  # Hydra's own settings (a launcher), a key removed: composing them is the check
        assert any(configured(point, override) for point in points), override


TRACE_ITEM = re.compile(r"^\d+\. `([^`]+)`:", re.MULTILINE)
HELPER = re.compile(r"`([\w./-]+)`")
MAX_TRACE = 15

#: What ``+exp=aime_budget_sweep`` executes that the README's numbered trace leaves out, by group:
#: helpers the path calls into, not steps a reader follows, each with the reason (a name ending in ``/``:
#: every file below it). The README names each of them, by group, in the paragraph after the list.
HELPER_GROUPS: dict[str, dict[str, str]] = {
    "start-up and configuration": {
        "snapeval/lm_eval_plugin.py": "the start-up hook each interpreter runs (.pth): it waits for lm-eval",
        "snapeval/paths.py": "where conf/ and tasks/ are",
        "snapeval/errors.py": "the one error type",
        "snapeval/cli.py": "one-line errors and the --db option of every command",
        "conf/model/smollm2-135m.yaml": "the default model's settings (the sweep names no model)",
        "conf/memory/default.yaml": "the memory estimator's settings, composed into every config",
        "snapeval/configs/compose.py": "Hydra composition behind the check",
        "snapeval/configs/legacy.py": "old key spellings rewritten before composing",
        "snapeval/configs/store.py": "registers the declarations in Hydra's ConfigStore",
        "snapeval/configs/root.py": "the declaration of the top-level groups",
        "snapeval/configs/task.py": "the declaration of a task's fields",
        "snapeval/configs/cache.py": "each method's parameters, defaults and checks",
        "snapeval/configs/methods.py": "the methods by name, and what is stored of their parameters",
        "snapeval/configs/values.py": "the parameters' single-value checks",
        "snapeval/configs/fields.py": "the setting() helper and its value checks",
    },
    "checks before the model loads": {
        "snapeval/preflight.py": "checks of inputs, drafts and shards before torch loads",
        "snapeval/protocols.py": "announces a named protocol (none in this sweep)",
        "snapeval/batch_rows.py": "rows capped by requests and free memory",
    },
    "model, task, prompt": {
        "snapeval/models.py": "loads the model and tokenizer, the chat template",
        "snapeval/tasks/__init__.py": "the registry: a task name to its module",
        "snapeval/tasks/base.py": "what every task declares, where rows come from; aime24's base class",
        "snapeval/tasks/qwen_math_grader.py": "the scorer aime24 calls",
        "snapeval/prompting.py": "text cut to the window, encoding, the query split: the request builder's",
    },
    "decoding": {
        "snapeval/cache/": "the engine behind the batcher: attention, each method's selection, slots, rings",
        "snapeval/continuous/compiled.py": "the compiled decode step (eager on CPU)",
        "snapeval/continuous/prefills.py": "one prefill copied into its rows",
        "snapeval/continuous/rows.py": "per-row sampling state and answers",
        "snapeval/continuous/work.py": "the requests waiting for a row",
        "snapeval/generation.py": "one forward step's logits and token",
        "snapeval/sampling.py": "the counter-based sampler",
        "snapeval/stops.py": "when an answer ends",
        "snapeval/workers.py": "claims on samples shared with other workers",
    },
    "storing and reporting": {
        "snapeval/results/__init__.py": "the database's front (pandas and scipy loaded on first use)",
        "snapeval/results/connect.py": "opens the database",
        "snapeval/results/schema.py": "the tables, and whether a database is snapeval's",
        "snapeval/results/leases.py": "the heartbeat that keeps claims alive",
        "snapeval/results/summary.py": "the table's numbers, read back from the database",
        "snapeval/stats.py": "intervals (Wilson) and pass@k",
        "snapeval/tables.py": "the one table formatter",
        "snapeval/sweep.py": "Hydra's callback for a sweep's table (a multirun's)",
    },
    "figures": {
        "snapeval/figures/panels.py": "one panel per experiment, legends",
        "snapeval/figures/style.py": "colours, markers, labels",
        "snapeval/figures/sweeps.py": "a method's series over budgets, the x-dodge",
        "snapeval/figures/heatmap.py": "another figure from the same rows (window x kernel)",
        "snapeval/figures/kept.py": "another figure from the same rows (kept positions)",
        "snapeval/figures/memory.py": "another figure from the same rows (accuracy vs memory)",
        "snapeval/figures/traces.py": "another figure from the same rows (traces vs budget)",
        "snapeval/figures/evictions.py": "another figure from the same rows (re-selections while decoding)",
    },
}
LEAF_HELPERS: dict[str, str] = {name: why for group in HELPER_GROUPS.values() for name, why in group.items()}


def readme_trace() -> list[str]:
    """The files of the README's numbered trace, in order."""
    return TRACE_ITEM.findall(README.read_text().split("## Layout", 1)[1])


def readme_helpers() -> set[str]:
    """The names in backticks of the paragraph after the numbered trace (the helpers it leaves out)."""
    after = README.read_text().split("## Layout", 1)[1].split("\n\n")
    numbered = next(i for i, paragraph in enumerate(after) if TRACE_ITEM.search(paragraph))
    return set(HELPER.findall(after[numbered + 1]))


def helper_of(name: str, helpers: dict[str, str]) -> str | None:
    """The entry of ``helpers`` that covers file ``name`` (itself, or a folder above it), if any."""
    return next((h for h in helpers if name == h or (h.endswith("/") and name.startswith(h))), None)


def trace_difference(listed: list[str], executed: list[str], helpers: dict[str, str]) -> dict[str, list[str]]:
    """How a listed trace differs from the executed files less ``helpers``: files that ran but are
    neither listed nor helpers, listed files that did not run or are helpers, files listed twice, and
    helpers that cover nothing that ran."""
    path = [name for name in executed if helper_of(name, helpers) is None]
    return {
        "ran, not listed": sorted(set(path) - set(listed)),
        "listed, did not run": sorted(set(listed) - set(executed)),
        "listed and a helper": sorted(name for name in listed if helper_of(name, helpers)),
        "listed twice": sorted({name for name in listed if listed.count(name) > 1}),
        "helper that did not run": sorted(
            h for h in helpers if not any(helper_of(n, {h: ""}) for n in executed)
        ),
    }


def test_the_trace_comparison_finds_every_kind_of_difference():
    executed = ["snapeval/a.py", "snapeval/b.py", "snapeval/cache/x.py", "snapeval/cache/y.py"]
    helpers = {"snapeval/cache/": "the engine", "snapeval/gone.py": "no longer runs"}
    assert trace_difference(
        ["snapeval/b.py", "snapeval/b.py", "snapeval/cache/x.py", "snapeval/c.py"], executed, helpers
    ) == {
        "ran, not listed": ["snapeval/a.py"],
        "listed, did not run": ["snapeval/c.py"],
        "listed and a helper": ["snapeval/cache/x.py"],
        "listed twice": ["snapeval/b.py"],
        "helper that did not run": ["snapeval/gone.py"],
    }
    assert not any(
        trace_difference(["snapeval/a.py", "snapeval/b.py"], executed, {"snapeval/cache/": ""}).values()
    )


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    from .trace import measure

    return measure(tmp_path_factory.mktemp("trace"))


def test_the_readme_traces_exactly_what_the_sweep_executes_less_the_named_helpers(executed):
    """``+exp=aime_budget_sweep`` (one problem, a tiny random model) and its figures, run under a trace:
    the README's numbered list is every file that ran, less :data:`LEAF_HELPERS`, each once."""
    listed = readme_trace()
    assert len(listed) <= MAX_TRACE, listed
    difference = trace_difference(listed, list(executed), LEAF_HELPERS)
    assert not any(difference.values()), {kind: names for kind, names in difference.items() if names}
    assert "snapeval/tasks/aime24.py" in listed and "conf/exp/aime_budget_sweep.yaml" in listed


def test_the_readme_names_every_helper_the_trace_leaves_out():
    assert readme_helpers() >= set(LEAF_HELPERS), sorted(set(LEAF_HELPERS) - readme_helpers())


def test_the_readme_engine_example_runs_and_a_cache_holding_the_prompt_equals_plain_generate(tiny_llama):
    """The Python block under "The cache engine", run as written on a tiny Llama: ``SnapStreamCache(budget=
    1024)`` holds a 40-token prompt whole, so its tokens are plain transformers' (on every supported
    transformers: ``.ci/run`` runs this at both ends of the range)."""
    import torch

    section = README.read_text().split("## The cache engine", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    model, reference = FAMILIES["llama"](TINY_VOCAB), FAMILIES["llama"](TINY_VOCAB)
    model.generation_config.eos_token_id = reference.generation_config.eos_token_id = None
    input_ids = torch.arange(3, 43)[None]
    namespace = {"model": model, "input_ids": input_ids}
    exec(code.replace("max_new_tokens=256", "max_new_tokens=12"), namespace)
    expected = reference.generate(input_ids, max_new_tokens=12, do_sample=False)
    assert namespace["out"].shape == (1, 52)
    assert torch.equal(namespace["out"], expected)
