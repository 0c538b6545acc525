"""Peak memory of a long prompt's prefill, whole vs chunked (``cache.prefill_chunk``), for every method that
can prefill in chunks, and the same bound scaled to Llama-3.1-8B at 128k tokens on one H100.

A random-weight Llama (4 layers, hidden 256, intermediate 1024, 4 query / 2 KV heads of 64, float32, CPU)
prefills one prompt of ``--length`` tokens into each method's cache at ``--budget`` slots, once whole and
once ``--chunk`` tokens at a time, as a run prefills (:func:`snapeval.decode.generation.prefill_logits`).
Peak memory is the process's resident set (torch has no allocation counter on CPU, and tracemalloc does
not see its tensors): the kernel's high-water mark (VmHWM) reset right before each prefill, minus what was
resident then, so each cell is what that prefill alone added at its peak (activations, the layer's keys
and values before compression, the scores). Elsewhere than Linux the mark cannot be reset and the script
says so.

The scaled line: the memory estimator has no activation estimate, so it prints the first-order bound of
the tokens one model call holds at once, T (the prompt whole; the chunk when chunked), with Llama-3.1-8B's
geometry (:mod:`snapeval.memory`) in bf16: an MLP's three intermediate tensors and two hidden-size ones,
``T * (2 * hidden + 3 * intermediate) * 2`` bytes, plus one layer's uncompressed keys and values,
``T' * 2 * kv_heads * head_dim * 2`` bytes (T' = T whole, budget + chunk chunked), plus a chunk's boolean
mask over what the cache holds, ``heads * chunk * (budget + chunk)`` bytes; attention by a fused kernel
(no T x T scores), nothing else kept between layers.

    python benchmarks/prefill_chunk.py                     # 8k and 16k tokens, chunk 256, budget 1024
    python benchmarks/prefill_chunk.py --smoke             # 1k tokens, once (CI)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence

import torch
from arguments import at_least, cache_setting
from machine import MIB, PeakRss, available_cores, cpu_model
from tabulate import tabulate
from transformers import LlamaConfig, LlamaForCausalLM

from snapeval.cache import build_cache, install
from snapeval.cli import one_line_errors
from snapeval.decode.generation import prefill_logits
from snapeval.memory.catalogue import model_aliases, model_source, shipped_config
from snapeval.memory.estimate import estimate
from snapeval.memory.geometry import load_geometry

SHAPE = {
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
}
SCALED = ("llama-3.1-8b-instruct", "h100", 131072)  # model, hardware, prompt tokens of the scaled line
GIB = 2**30


def methods(budget: int) -> dict[str, dict]:
    """Every method that can prefill in chunks, at ``budget`` slots (speculative prefill and kvpress
    cannot: they read the whole prompt at once)."""
    return {
        "full": {"method": "full"},
        "streaming_llm": {"method": "streaming_llm", "budget": budget},
        "snapkv": {"method": "snapkv", "budget": budget},
        "snapstream": {"method": "snapstream", "budget": budget},
        "sage_kv": {"method": "sage_kv", "budget": budget},
        "rkv": {"method": "rkv", "budget": budget},
    }


@torch.inference_mode()
def prefill_peak(model, ids: list[int], node: dict, peak: PeakRss) -> tuple[float, float, float]:
    """MiB the prefill of ``ids`` into a cache of ``node`` added at its peak, its seconds and the MiB its
    cache holds after."""
    cache = build_cache(node)
    peak.reset()
    before = peak.mib()
    start = time.perf_counter()
    prefill_logits(model, ids, cache)
    seconds = time.perf_counter() - start
    return peak.mib() - before, seconds, cache.kv_bytes() / MIB


def rows(model, length: int, chunk: int, budget: int, peak: PeakRss) -> list[list]:
    ids = torch.randint(10, SHAPE["vocab_size"], (length,), generator=torch.Generator().manual_seed(0))
    table = []
    for name, node in methods(budget).items():
        whole, whole_s, kv = prefill_peak(model, ids.tolist(), node, peak)
        chunked, chunked_s, _ = prefill_peak(model, ids.tolist(), {**node, "prefill_chunk": chunk}, peak)
        cells = [f"{whole:.0f}", f"{chunked:.0f}", f"{whole / max(chunked, 1):.1f}", f"{kv:.1f}"]
        table.append([name, length, *cells, f"{whole_s:.1f}", f"{chunked_s:.1f}"])
    return table


def scaled_line(chunk: int, budget: int) -> str:
    """The first-order bound of the module docstring for Llama-3.1-8B in bf16 at 128k tokens."""
    name, hardware, tokens = SCALED
    geometry = load_geometry(name)
    config = shipped_config(model_source(model_aliases().get(name, name)))
    per_token = (2 * config["hidden_size"] + 3 * config["intermediate_size"]) * 2
    kv_per_token = 2 * geometry.num_kv_heads * geometry.head_dim * 2
    whole = tokens * (per_token + kv_per_token)
    mask = geometry.num_attention_heads * chunk * (budget + chunk)
    chunked = chunk * per_token + (budget + chunk) * kv_per_token + mask
    fit = estimate(name, hardware, context=tokens, budget=budget)
    hbm = next(tier.capacity for tier in fit.tiers if tier.name == "hbm")
    share = f" ({whole / hbm:.0%} of its {hbm / 1e9:.0f} GB HBM)"
    return (
        f"{geometry.name} on one {hardware.upper()}, bf16, {tokens:,} tokens, budget {budget}: prefill"
        f" working set whole {whole / GIB:.2f} GiB{share}, prefill_chunk={chunk} {chunked / 2**20:.1f} MiB"
        f" ({whole / chunked:.0f}x less); weights {fit.weights_bytes / GIB:.1f} GiB, full KV"
        f" {fit.kv_bytes_per_sequence_full / GIB:.1f} GiB (the estimator)"
    )


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384], help="prompt tokens")
    parser.add_argument("--chunk", type=int, default=256, help="cache.prefill_chunk")
    parser.add_argument("--budget", type=int, default=1024, help="slots of every compressing method")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--smoke", action="store_true", help="1k tokens, chunk 128, budget 256 (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.lengths, args.chunk, args.budget = [1024], 128, 256
    at_least(args, {"--lengths": 2, "--chunk": 1, "--threads": 1})
    for node in methods(args.budget).values():
        cache_setting(
            {**node, "prefill_chunk": args.chunk}, {"budget": "--budget", "prefill_chunk": "--chunk"}
        )
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = install(LlamaForCausalLM(LlamaConfig(**SHAPE)).eval())
    peak = PeakRss()
    print(f"- date: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
    print(
        f"- machine: {cpu_model() or platform.processor()}, {available_cores()} cores, torch"
        f" {torch.__version__} ({torch.get_num_threads()} threads), Python {platform.python_version()}"
    )
    print(f"- load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"- peak: {peak.source}; each cell minus the resident set right before its prefill\n")
    table = [line for length in args.lengths for line in rows(model, length, args.chunk, args.budget, peak)]
    headers = ["method", "prompt tokens", "whole peak MiB", f"chunk {args.chunk} peak MiB", "whole / chunk"]
    print(tabulate(table, headers=[*headers, "KV MiB held", "whole s", "chunked s"], tablefmt="github"))
    print(f"\n- {scaled_line(args.chunk, args.budget)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
