"""Throughput benchmark: one by one vs static batches vs continuous batching, eager vs compiled.

A reasoning-like workload on the embedded SmolLM2-135M-Instruct: AIME24 prompts, ``--draws`` sampled
answers each (T=0.6, top-p 0.95), up to ``--max-new-tokens`` tokens, stopping at EOS, so answer lengths
vary. Every mode answers the same requests and must give the same tokens (checked); it prints, per mode,
the wall time, the generated tokens/s and the decode step's own time per step:

* one by one: :func:`snapeval.decode.generation.generate` per answer (a growing cache, batch 1), on the first
  ``--one-by-one`` answers only (it is by far the slowest; its tokens/s is a rate all the same);
* static batches: ``--rows`` answers at a time at the fixed shape, the next batch only when every row
  of the last has stopped (``ContinuousBatcher(refill=False)``), the draws of a prompt sharing a prefill;
* continuous: the same rows, each refilled as soon as its answer stops;
* continuous, compiled: the decode step under ``torch.compile(fullgraph=True, dynamic=False)``, after a
  warm-up run that compiles it (compile seconds reported apart).

    python benchmarks/throughput.py                        # 4 problems x 8 draws, 512 tokens, 8 rows
    python benchmarks/throughput.py --problems 4 --rows 16 --method snapstream --budget 256

Data: ``SNAPEVAL_DATA_DIR`` or ``../shared/data`` when present, else the Hub (``HuggingFaceH4/aime_2024``).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import transformers
from arguments import at_least, cache_setting
from engine import SPEC
from machine import available_cores, cpu_model
from tabulate import tabulate
from tqdm import tqdm

from snapeval.cache import build_cache, install
from snapeval.cli import one_line_errors
from snapeval.configs.compose import compose_config
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.generation import generate
from snapeval.decode.sampling import Sampling
from snapeval.models import load_model, load_tokenizer
from snapeval.run.prompting import encode_with_split
from snapeval.tasks import load_task

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def aime_requests(tokenizer, args: argparse.Namespace, stop_ids: frozenset[int]) -> list[Request]:
    if "SNAPEVAL_DATA_DIR" not in os.environ and SHARED_DATA.is_dir():
        os.environ["SNAPEVAL_DATA_DIR"] = str(SHARED_DATA)
    cfg = compose_config("task=aime24")
    prompts = load_task(cfg["task"], seed=0).prompts(tokenizer)[: args.problems]
    cache = cache_of(args)
    requests = []
    for prompt in prompts:
        ids, _ = encode_with_split(tokenizer, prompt.messages, None)
        for draw in range(args.draws):
            sampling = Sampling(do_sample=True, temperature=0.6, top_p=0.95, seed=1000 * len(requests) + draw)
            requests.append(
                Request(tuple(ids), cache, args.max_new_tokens, sampling, stop_ids, tag=len(requests))
            )
    return requests


def cache_of(args: argparse.Namespace) -> dict:
    """The cache every answer decodes with: ``--method``, at ``--budget`` unless it is the full cache."""
    return {"method": args.method} | ({"budget": args.budget} if args.method != "full" else {})


def batched(model, requests: list[Request], rows: int, compile: str, refill: bool, warm_up: bool = False):
    """Answer ``requests`` with a batcher of ``rows``: (tokens by tag, wall s, steps, step s, compile s)."""
    batcher = ContinuousBatcher(model, rows, compile, refill)
    batcher.reserve(requests)
    compile_s = 0.0
    if warm_up:  # compile the step on the same slot cache, with short answers
        start = time.perf_counter()
        batcher.run([_short(r) for r in requests[:rows]], lambda answer: None)
        compile_s = time.perf_counter() - start
        batcher.steps, batcher.step_seconds = 0, 0.0
    tokens: dict = {}
    progress = tqdm(total=len(requests), desc=f"{'continuous' if refill else 'static'} {compile}")

    def on_answer(answer) -> None:
        tokens[answer.request.tag] = answer.tokens
        progress.update()

    start = time.perf_counter()
    batcher.run(requests, on_answer)
    progress.close()
    return tokens, time.perf_counter() - start, batcher.steps, batcher.step_seconds, compile_s


def _short(request: Request) -> Request:
    return Request(request.prompt_ids, request.cache, 4, request.sampling, frozenset(), tag=None)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=4, help="AIME24 problems (default 4)")
    parser.add_argument("--draws", type=int, default=8, help="sampled answers per problem (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="tokens per answer at most")
    parser.add_argument("--rows", type=int, default=8, help="rows decoding together (default 8)")
    parser.add_argument("--method", default="snapstream", help="cache method (default snapstream)")
    parser.add_argument("--budget", type=int, default=256, help="budget of a compressing method")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    parser.add_argument("--one-by-one", type=int, default=8, help="answers timed one by one (0: none)")
    args = parser.parse_args(argv)
    positive = ("--problems", "--draws", "--rows", "--budget", "--threads")
    # 2 new tokens: the prefill's and one decoded, which the step times are of
    at_least(args, {**dict.fromkeys(positive, 1), "--max-new-tokens": 2, "--one-by-one": 0})
    cache_setting(cache_of(args), {"method": "--method", "budget": "--budget"})
    return args


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    model, tokenizer = install(load_model(SPEC)), load_tokenizer(SPEC)
    requests = aime_requests(tokenizer, args, frozenset({tokenizer.eos_token_id}))
    results, reference = [], None

    def record(mode: str, tokens: dict, wall: float, steps: int | None, step_s: float | None, compile_s=0.0):
        nonlocal reference
        reference = reference or tokens
        same = all(reference.get(tag, answer) == answer for tag, answer in tokens.items())
        reference = {**tokens, **reference}
        generated = sum(len(t) for t in tokens.values())
        results.append(
            {
                "mode": mode,
                "answers": len(tokens),
                "tokens": generated,
                "wall s": round(wall, 1),
                "tok/s": round(generated / wall, 1),
                "steps": steps if steps is not None else generated,
                "ms/step": round(1000 * step_s / steps, 1) if steps else "-",
                "compile s": round(compile_s, 1) if compile_s else "-",
                "same tokens": same,
            }
        )

    if args.one_by_one:
        start, tokens = time.perf_counter(), {}
        for r in tqdm(requests[: args.one_by_one], desc="one by one"):
            answer = generate(
                model, list(r.prompt_ids), build_cache(r.cache), r.max_new_tokens, set(r.stop_ids), r.sampling
            )
            tokens[r.tag] = answer.tokens
        record("one by one", tokens, time.perf_counter() - start, None, None)
    record(f"static batches x{args.rows}", *batched(model, requests, args.rows, "off", refill=False)[:4])
    record(f"continuous x{args.rows}", *batched(model, requests, args.rows, "off", refill=True)[:4])
    record(
        f"continuous x{args.rows}, compiled", *batched(model, requests, args.rows, "on", True, warm_up=True)
    )

    by_mode = {
        row["mode"].split(" x")[0] + (" compiled" if "compiled" in row["mode"] else ""): row
        for row in results
    }
    static, continuous = by_mode["static batches"], by_mode["continuous"]
    compiled = by_mode["continuous compiled"]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"machine: {cpu_model()}, {available_cores()} cores, torch {torch.__version__} "
        f"({args.threads} threads), transformers {transformers.__version__}, Python "
        f"{platform.python_version()}; load average {load}\n"
        f"model: {SPEC.name} {SPEC.dtype}; cache {requests[0].cache}; {args.problems} AIME24 problems x "
        f"{args.draws} draws, T=0.6 top-p 0.95, up to {args.max_new_tokens} new tokens\n"
    )
    print(tabulate(results, headers="keys", tablefmt="github"))
    lengths = sorted(len(answer) for answer in reference.values())
    truncated = sum(length == args.max_new_tokens for length in lengths)
    print(
        f"\nanswer lengths: mean {sum(lengths) / len(lengths):.0f}, median {lengths[len(lengths) // 2]}, "
        f"min {lengths[0]}, max {lengths[-1]}; {truncated}/{len(lengths)} hit max-new-tokens"
    )
    ratio = continuous["tok/s"] / static["tok/s"]
    step_ratio = continuous["ms/step"] / compiled["ms/step"]
    print(f"\ncontinuous / static tokens/s: {ratio:.2f}x ({verdict(ratio, 1.5)})")
    print(f"compiled / eager decode step: {step_ratio:.2f}x ({verdict(step_ratio, 1.2)})")
    return 0


def verdict(ratio: float, goal: float) -> str:
    return f"goal >= {goal}x: {'met' if ratio >= goal else 'NOT met'}"


if __name__ == "__main__":
    sys.exit(main())
