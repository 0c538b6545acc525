"""Draws benchmark: n sampled answers to one prompt, one by one vs. decoded together after one prefill.

The AIME/LiveCodeBench protocols sample n answers per problem (pass@1 over n, pass@k). snapeval's runner
and lm-eval model prefill (and compress) the prompt once, copy the cache into one batch row per draw and
decode the rows together (``generation.draw_batch``). This prints, per method and n, the wall time of n
separate generations and of one batched generation of the same n draws, on the embedded SmolLM2-135M:

    python benchmarks/draws.py                       # 1,024-token prompt, n = 1, 4, 8, full and snapstream
    python benchmarks/draws.py --draws 8 16 --length 2048 --decode-tokens 128

Every generation decodes exactly ``--decode-tokens`` tokens (EOS ignored), sampled at temperature 0.6.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Sequence

import torch
import transformers
from engine import SPEC, available_cores, cpu_model, prompt_ids
from tabulate import tabulate

from snapeval.cache import build_cache, install
from snapeval.generation import Sampling, generate, generate_draws
from snapeval.models import load_model, load_tokenizer


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def bench(model, ids: list[int], cache_params: dict, draws: int, decode_tokens: int) -> dict:
    samplings = [Sampling(do_sample=True, temperature=0.6, seed=seed) for seed in range(draws)]
    one_by_one = timed(
        lambda: [generate(model, ids, build_cache(cache_params), decode_tokens, set(), s) for s in samplings]
    )
    cache = build_cache(cache_params)
    together = timed(lambda: generate_draws(model, ids, cache, decode_tokens, set(), samplings))
    return {
        "method": cache_params["method"],
        "budget": cache_params.get("budget") or "-",
        "prompt tokens": len(ids),
        "draws": draws,
        "one by one s": round(one_by_one, 2),
        "together s": round(together, 2),
        "speed-up": f"{one_by_one / together:.2f}x",
        "KV MiB (all rows)": round(cache.kv_bytes() / 2**20, 1),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024, help="prompt tokens (default 1024)")
    parser.add_argument("--draws", type=int, nargs="+", default=[1, 4, 8], help="answers per prompt")
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens per answer (default 64)")
    parser.add_argument("--budget", type=int, default=256, help="SnapStream budget (default 256)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    model = install(load_model(SPEC))
    ids = prompt_ids(load_tokenizer(SPEC), args.length, seed=0)
    methods = [{"method": "full"}, {"method": "snapstream", "budget": args.budget}]
    with torch.inference_mode():
        generate(model, ids, build_cache(methods[0]), 4, set())  # warm-up
        rows = [bench(model, ids, params, n, args.decode_tokens) for params in methods for n in args.draws]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"machine: {cpu_model()}, {available_cores()} cores, torch {torch.__version__} "
        f"({args.threads} threads), Python {platform.python_version()}; load average {load}\n"
        f"model: {SPEC.name} {SPEC.dtype}; {args.decode_tokens} tokens per draw (EOS ignored), T=0.6\n"
    )
    print(tabulate(rows, headers="keys", tablefmt="github"))


if __name__ == "__main__":
    main()
