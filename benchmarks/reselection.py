"""Decode-step cost with decode-time re-selection vs without, in the batcher's fixed rows.

The embedded SmolLM2-135M-Instruct decodes ``--rows`` rows of a synthetic ``--prompt``-token prompt for
``--steps`` steps each (end of sequence ignored, greedy), once per cache setting, every setting holding
rows of the same slots, in one run:

* R-KV (budget B, buffer b): rows of B + b slots, re-selected whenever full, vs a fixed ring of as many
  slots (SnapStream, budget B + b, ring b: it evicts its oldest instead of re-scoring);
* SnapStream with ``reselect_every`` k vs plain SnapStream at the same budget;
* kvpress decoding (KnormPress, every b steps down to B: rows of B + b slots) vs the same ring, when the
  kvpress extra is installed.

Per setting it prints the decode wall time per step (the step itself, and the re-selections run between
steps), the step alone, the re-selections made, and the ratio of the per-step wall time to the setting's
reference without re-selection: medians over ``--repeats`` rounds, each round running every setting in
turn (every other round in reverse order), so slow drifts in machine load hit them alike.

    python benchmarks/reselection.py                              # 8 rows, 512 steps, B 256, b 64
    python benchmarks/reselection.py --rows 4 --steps 256 --compile on
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence

import torch
import transformers
from arguments import at_least, cache_setting
from engine import SPEC
from machine import available_cores, cpu_model
from tabulate import tabulate

from snapeval.cache import install
from snapeval.cli import one_line_errors
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.models import load_model


def settings(budget: int, buffer: int) -> list[tuple[str, dict, str | None]]:
    """(name, cache, name of its reference without re-selection) per setting, references first."""
    ring = {"method": "snapstream", "budget": budget + buffer, "ring": buffer}
    plain = {"method": "snapstream", "budget": budget, "ring": buffer}
    rows = [
        ("SnapStream ring, B+b slots", ring, None),
        (
            "R-KV, B + b slots",
            {"method": "rkv", "budget": budget, "buffer": buffer},
            "SnapStream ring, B+b slots",
        ),
        ("SnapStream, B slots", plain, None),
        ("SnapStream reselect_every b/4", {**plain, "reselect_every": buffer // 4}, "SnapStream, B slots"),
    ]
    if importlib.util.find_spec("kvpress") is not None:
        press = {"method": "kvpress", "budget": budget, "press": "KnormPress", "decoding": True}
        rows.append(
            (
                "kvpress KnormPress decoding, B+b slots",
                {**press, "compression_interval": buffer},
                "SnapStream ring, B+b slots",
            )
        )
    return rows


def measure(model, cache: dict, args: argparse.Namespace) -> dict:
    """Decode ``args.rows`` rows of ``args.steps`` steps with ``cache``: seconds and re-selections."""
    generator = torch.Generator().manual_seed(0)
    prompt = tuple(torch.randint(100, 40000, (args.prompt,), generator=generator).tolist())
    requests = [Request(prompt, cache, args.steps, tag=row) for row in range(args.rows)]
    batcher = ContinuousBatcher(model, args.rows, args.compile)
    batcher.reserve(requests)
    if batcher.mode != "eager":  # compile or capture the step once, apart
        batcher.run([Request(prompt, cache, 3, tag="warm-up")], lambda answer: None)
        batcher.steps, batcher.step_seconds = 0, 0.0
    answers = []
    start = time.perf_counter()
    batcher.run(requests, answers.append)
    wall = time.perf_counter() - start
    prefill = sum(answer.prefill_s for answer in answers)
    return {
        "steps": batcher.steps,
        "decode ms/step": 1000 * (wall - prefill) / batcher.steps,
        "step alone ms": 1000 * batcher.step_seconds / batcher.steps,
        "re-selections per row": sum(len(answer.evictions) for answer in answers) / len(answers),
        "KV MiB per row": answers[0].kv_bytes / 2**20,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="rows decoding together (default 8)")
    parser.add_argument("--steps", type=int, default=512, help="decode steps per row (default 512)")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens (default 512)")
    parser.add_argument("--budget", type=int, default=256, help="B: slots kept at a re-selection")
    parser.add_argument("--buffer", type=int, default=64, help="b: R-KV's buffer, kvpress's interval")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over every setting (median)")
    parser.add_argument("--compile", default="off", choices=["off", "on"], help="compile the step")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    args = parser.parse_args(argv)
    positive = ("--rows", "--prompt", "--budget", "--buffer", "--repeats", "--threads")
    at_least(args, {**dict.fromkeys(positive, 1), "--steps": 2})  # 2 steps: the prefill's token, one decoded
    flags = {
        "budget": "--budget",
        **dict.fromkeys(("ring", "buffer", "reselect_every", "compression_interval"), "--buffer"),
    }
    for _, cache, _ in settings(args.budget, args.buffer):
        cache_setting(cache, flags)
    return args


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    model = install(load_model(SPEC))
    model.generation_config.eos_token_id = None
    chosen = settings(args.budget, args.buffer)
    rounds = []
    for round_index in range(args.repeats):  # every other round in reverse: no setting always runs first
        order = list(range(len(chosen)))[:: 1 if round_index % 2 == 0 else -1]
        measured = {index: measure(model, chosen[index][1], args) for index in order}
        rounds.append([measured[index] for index in range(len(chosen))])
    results, by_name = [], {}
    for index, (name, _, reference) in enumerate(chosen):
        runs = [round_[index] for round_ in rounds]
        row = {"setting": name, **{key: statistics.median(run[key] for run in runs) for key in runs[0]}}
        base = by_name.get(reference)
        row["vs no re-selection"] = f"{row['decode ms/step'] / base['decode ms/step']:.2f}x" if base else "-"
        by_name[name] = row
        results.append(row)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"machine: {cpu_model()}, {available_cores()} cores, torch {torch.__version__} ({args.threads} "
        f"threads), transformers {transformers.__version__}, Python {platform.python_version()}; "
        f"load average {load}\nmodel: {SPEC.name} {SPEC.dtype}; {args.rows} rows x {args.steps} steps "
        f"after a {args.prompt}-token prompt; B={args.budget}, b={args.buffer}; compile {args.compile}\n"
    )
    print(tabulate(results, headers="keys", tablefmt="github", floatfmt=".2f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
