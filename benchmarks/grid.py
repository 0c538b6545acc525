"""Grid benchmark: a 13-setting cache grid from one prefill per prompt vs every setting on its own.

Settings: the full cache plus SnapStream at ``--budgets`` x ``--kernels`` (4 x 3 by default). Workloads:
LongBench-v2 prompts middle-truncated to ``--longbench-tokens`` (8k; needs the data: SNAPEVAL_DATA_DIR,
../shared/data, or the Hub) and offline RULER single-needle prompts at ``--ruler-tokens`` (4k). Greedy,
``--max-new-tokens`` per answer. Per workload it times, on the same prompts:

* one point: SnapStream (first budget and kernel) alone, its own prefill and decode;
* separate points: every setting alone, one after the other (what 13 separate runs compute);
* grid: every setting's request in one batcher, ``--rows`` rows: one prefill per prompt fills all the
  caches (:class:`snapeval.cache.grid.CacheGrid`), the settings decode together, each in rows of its own
  capacity class (:mod:`snapeval.decode.continuous.classes`);
* the same grid with every row as wide as the largest request's (one class of rows): the baseline that
  rows sized per setting are measured against.

and checks that the grid gives every setting the tokens it gives alone. Then, end to end, the shipped
``+exp=ruler_budget_sweep`` (16 settings x 10 prompts at 1,024 tokens) as one grid, against the same
sweep as a Hydra multirun of separate points (``grid=null cache=... cache.budget=...``, the way every
sweep ran before grids), each into a fresh database.

    python benchmarks/grid.py                       # everything, ~25 min on 2 busy cores
    python benchmarks/grid.py --skip-sweep --prompts 1 --longbench-tokens 4096
    python benchmarks/grid.py --skip-sweep --skip-separate --ruler-tokens 0   # the grid's ratio at 8k
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import torch
import transformers
from arguments import at_least, cache_setting
from engine import SPEC
from machine import available_cores, cpu_model
from tabulate import tabulate

from snapeval.cache import install
from snapeval.cli import one_line_errors
from snapeval.configs.compose import compose_config
from snapeval.configs.task import MIN_RULER_CONTEXT
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.continuous import batcher as batcher_module
from snapeval.decode.stops import stop_ids
from snapeval.errors import SnapevalError
from snapeval.models import load_model, load_tokenizer
from snapeval.run.prompting import encode_with_split, fit_to_window
from snapeval.tasks import load_task

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def settings(budgets: Sequence[int], kernels: Sequence[int]) -> list[dict]:
    snapstream = [{"method": "snapstream", "budget": b, "kernel": k} for b in budgets for k in kernels]
    return [{"method": "full"}, *snapstream]


def prompt_ids(task_overrides: Sequence[str], tokens: int, count: int, max_new: int, tokenizer) -> list:
    """``count`` prompts of a task, chat-encoded and middle-truncated to ``tokens`` (with room to answer)."""
    cfg = compose_config(*task_overrides)
    task = load_task(cfg["task"], seed=0)
    encoded = []
    for prompt in task.prompts(tokenizer)[:count]:
        messages = fit_to_window(tokenizer, prompt.messages, tokens - max_new, "middle")
        encoded.append(tuple(encode_with_split(tokenizer, messages, None)[0]))
    return encoded


def answer(model, requests: list[Request], rows: int) -> tuple[dict, float]:
    """Tokens by tag and wall seconds of answering ``requests`` with one batcher of ``rows`` rows."""
    got: dict = {}
    start = time.perf_counter()
    ContinuousBatcher(model, rows).run(requests, lambda a: got.__setitem__(a.request.tag, a.tokens))
    return got, time.perf_counter() - start


def workload(model, name: str, prompts: list, grid: list[dict], args, stop_ids) -> list[dict]:
    """The three paths on one workload: rows of the table."""

    def requests(caches: list[dict]) -> list[Request]:
        return [
            Request(ids, cache, args.max_new_tokens, stop_ids=stop_ids, tag=(p, str(cache)))
            for p, ids in enumerate(prompts)
            for cache in caches
        ]

    one_tokens, one_s = answer(model, requests([grid[1]]), args.rows)
    separate_tokens, separate_s = {}, 0.0
    for cache in [] if args.skip_separate else grid:
        tokens, seconds = answer(model, requests([cache]), args.rows)
        separate_tokens.update(tokens)
        separate_s += seconds
    grid_tokens, grid_s = answer(model, requests(grid), args.rows)
    with mock.patch.object(batcher_module, "plan_classes", lambda needs, rows: [(max(needs), rows)]):
        widest_tokens, widest_s = answer(model, requests(grid), args.rows)  # every row the largest's
    reference = separate_tokens or grid_tokens  # without the separate points: the grid's against one point
    same = grid_tokens == reference == widest_tokens and all(reference[t] == a for t, a in one_tokens.items())
    length = sum(len(ids) for ids in prompts) / len(prompts)
    context = f"{name}, {len(prompts)} prompt(s) of {length:.0f} tokens"
    paths = {
        "one point (snapstream)": one_s,
        f"{len(grid)} points, one grid": grid_s,
        f"{len(grid)} points, one grid, every row the widest": widest_s,
    }
    if not args.skip_separate:
        paths[f"{len(grid)} points, separately"] = separate_s
    # same tokens: the grid's and the one point's answers equal the separate points'
    return [
        {"workload": context, "path": path, "wall s": s, "same tokens": same} for path, s in paths.items()
    ]


def sweep(args) -> list[dict]:
    """``+exp=ruler_budget_sweep`` end to end: as one grid, and as a multirun of separate points."""
    ways = {
        "one grid (+exp=ruler_budget_sweep)": ["+exp=ruler_budget_sweep"],
        "16 points, separately (Hydra multirun)": [
            "-m",
            "+exp=ruler_budget_sweep",
            "grid=null",
            "cache=full,streaming_llm,snapkv,snapstream,sage_kv,speculative_prefill",
            "cache.budget=192,384,768",
        ],
    }
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, (name, overrides) in enumerate(ways.items()):
            command = [sys.executable, "-m", "snapeval", *overrides, "run.progress=false"]
            command += [f"run.db={scratch}/{index}.sqlite", f"hydra.sweep.dir={scratch}/sweep{index}"]
            command += [f"hydra.run.dir={scratch}/run{index}"]
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            workload = "ruler_budget_sweep end to end, 10 prompts of 1,024 tokens"
            elapsed = time.perf_counter() - start
            rows.append({"workload": workload, "path": name, "wall s": elapsed, "same tokens": "-"})
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--kernels", type=int, nargs="+", default=[3, 7, 11])
    parser.add_argument("--prompts", type=int, default=1, help="prompts per workload (default 1)")
    parser.add_argument("--longbench-tokens", type=int, default=8192, help="0 skips LongBench-v2")
    parser.add_argument("--ruler-tokens", type=int, default=4096, help="0 skips RULER")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rows", type=int, default=13, help="batcher rows (default: one per setting)")
    parser.add_argument("--skip-sweep", action="store_true", help="leave out the end-to-end sweep")
    parser.add_argument("--skip-separate", action="store_true", help="leave out the settings one by one")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    args = parser.parse_args(argv)
    positive = ("--budgets", "--kernels", "--prompts", "--max-new-tokens", "--rows", "--threads")
    at_least(args, {**dict.fromkeys(positive, 1), "--longbench-tokens": 0, "--ruler-tokens": 0})
    if 0 < args.longbench_tokens <= args.max_new_tokens:
        message = f"must be 0 (no LongBench-v2) or more than --max-new-tokens ({args.max_new_tokens})"
        raise SnapevalError(f"{message}, got {args.longbench_tokens}", "--longbench-tokens")
    if 0 < args.ruler_tokens < MIN_RULER_CONTEXT:
        message = f"must be 0 (no RULER) or >= {MIN_RULER_CONTEXT}, got {args.ruler_tokens}"
        raise SnapevalError(message, "--ruler-tokens")
    for setting in settings(args.budgets, args.kernels):
        cache_setting(setting, {"budget": "--budgets", "kernel": "--kernels"})
    return args


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    if "SNAPEVAL_DATA_DIR" not in os.environ and SHARED_DATA.is_dir():
        os.environ["SNAPEVAL_DATA_DIR"] = str(SHARED_DATA)
    model, tokenizer = install(load_model(SPEC)), load_tokenizer(SPEC)
    stops = stop_ids(tokenizer, model.generation_config)  # the runner's
    grid = settings(args.budgets, args.kernels)
    workloads = []
    if args.longbench_tokens:
        workloads.append(("LongBench-v2", ["task=longbench_v2"], args.longbench_tokens))
    if args.ruler_tokens:
        ruler = ["task=ruler_niah_single", f"task.context_length={args.ruler_tokens}"]
        workloads.append(("RULER niah_single", ruler, args.ruler_tokens + args.max_new_tokens))
    rows = []
    for name, overrides, tokens in workloads:
        prompts = prompt_ids(overrides, tokens, args.prompts, args.max_new_tokens, tokenizer)
        rows += workload(model, name, prompts, grid, args, stops)
        print(f"[grid] {name} done", file=sys.stderr, flush=True)
    if not args.skip_sweep:
        rows += sweep(args)
    for row in rows:  # within a workload, to its first row: the one point (the grid, for the sweep)
        first = next(r for r in rows if r["workload"] == row["workload"])
        row["ratio"] = round(row["wall s"] / first["wall s"], 2)
        row["wall s"] = round(row["wall s"], 1)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"machine: {cpu_model()}, {available_cores()} cores, torch {torch.__version__} ({args.threads} "
        f"threads), transformers {transformers.__version__}, Python {platform.python_version()}; load "
        f"average {load}\nmodel: {SPEC.name} {SPEC.dtype}; grid: full + snapstream budgets {args.budgets} "
        f"x kernels {args.kernels}; greedy, {args.max_new_tokens} new tokens; {args.rows} rows\n"
    )
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
