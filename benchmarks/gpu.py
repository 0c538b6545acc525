"""Prefill and decode of the engine at Llama-3.1-8B shape on a GPU, against plain transformers and the
memory floor; on a CPU, the same measurements at stand-in sizes (``--smoke``, which CI runs).

Random weights (no download), built on the device in bfloat16 (CPU: float32). Through the package's own
API (``install``, ``build_cache``, ``ContinuousBatcher``, ``prefill_logits``), it prints:

* prefill: seconds and peak device memory of one prompt per context, plain transformers (a
  ``DynamicCache``) vs the engine's full cache vs SnapStream;
* decode, per context (8k, 32k, 128k): ms per step and tokens/s of the full cache (4 rows; 1 at 128k),
  the same rows with FP8 slots (``cache.kv_dtype=fp8_e4m3``: half the K/V bytes, read back in bfloat16
  each step) and SnapStream rows at equal KV memory (``rows x context / budget`` rows), in each compile
  mode (off; on: on CUDA a CUDA graph; graphs: the eager step captured as CUDA graphs, CUDA only) and each
  ``--decode-attention`` (the decode name says which attention ran), then plain transformers on the full
  cache's rows and prompt (``gpu_peer.py``: eager over a ``DynamicCache``, and over a ``StaticCache``
  with the one-token forward compiled), with the warm-up seconds (compile included), the bytes a step
  must read (the weights once, every held K/V byte once), the floor those take at the measured copy
  bandwidth, and the step's ratio to that floor; with ``--profile DIR``, each setting's top 15 kernels per
  step (``gpu_profile.py``);
* decode attention alone at the decode table's (rows, held slots): grouped SDPA vs split-KV, ms per
  layer call against reading the held K and V once (``gpu_exactness.py``);
* exactness on a small float32 model on the same device (``gpu_exactness.py``): full cache == plain
  transformers, SnapStream at a budget holding the prompt == full, batched rows == each alone in every
  compile mode (graphs == eager token for token) and with the split-KV attention, and both decode
  attentions' bits the same on re-run and whatever the other rows hold (bf16);
* loading: peak host memory while a saved random Llama loads onto the device (on CUDA at 8B width, 4
  layers; on a CPU at the stand-in size), the old path (``from_pretrained`` then ``.to``) vs
  ``load_model`` (``device_map``), each in a fresh process (``benchmarks/load_memory.py``).

    python benchmarks/gpu.py --smoke                                # CPU stand-in, ~30 s (CI)
    python benchmarks/gpu.py --smoke --profile /tmp/prof            # and each setting's top kernels
    python benchmarks/gpu.py                                        # CUDA: 8k, 32k and 128k, 8B shape
    python benchmarks/gpu.py --contexts 8192 --compile off          # quicker
    python benchmarks/gpu.py --full-rows 4 4 1 --compile on --profile prof  # rows per context
    python benchmarks/gpu.py --compile graphs --decode-attention grouped split   # the two attentions

The GPU machines lent here have torch and transformers but not hydra/omegaconf, which snapeval's
parameter declarations import: carry them, ``pip install --no-deps --target .gpu-deps hydra-core
omegaconf antlr4-python3-runtime==4.9.3 tabulate``, then ``PYTHONPATH=.gpu-deps python benchmarks/gpu.py``.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import gpu_peer
import load_memory
import torch
import transformers
from arguments import at_least, cache_setting
from gpu_exactness import attention_rows, exactness, snapstream
from gpu_profile import LEAST_TOKENS, TOP, setting_profile, synchronize
from tabulate import tabulate
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from snapeval.cache import build_cache, install
from snapeval.cache.attention import cache_keyword
from snapeval.cli import one_line_errors
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.generation import prefill_logits
from snapeval.errors import SnapevalError

LLAMA_8B = {  # Llama-3.1-8B's geometry
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
}
STAND_IN = {**LLAMA_8B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2}
STAND_IN.update(num_attention_heads=8, num_key_value_heads=2, vocab_size=2048, max_position_embeddings=8192)
SMALL = {**STAND_IN, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
LOAD = {**LLAMA_8B, "num_hidden_layers": 4}  # loaded from disk on CUDA: ~1.9 B parameters, ~3.6 GiB bf16


def build(shape: dict, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A random-weight Llama of ``shape``, built on ``device`` in ``dtype``, with the engine installed."""
    return install(random_llama(shape, dtype, device))


def random_llama(shape: dict, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """A random-weight Llama of ``shape``, built on ``device`` in ``dtype``."""
    torch.manual_seed(0)
    config = LlamaConfig(**shape, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = None
    return model


def load_rows(shape: dict, dtype: torch.dtype, device: torch.device) -> list[list]:
    """Peak host memory while a saved random Llama of ``shape`` loads onto ``device``: the old path
    (``from_pretrained`` onto the host, then ``.to``) vs ``load_model`` (``device_map``), each in a fresh
    process (``benchmarks/load_memory.py``)."""
    with tempfile.TemporaryDirectory() as folder:
        model = random_llama(shape, dtype, device)
        parameters = sum(p.numel() for p in model.parameters())
        name = f"Llama {parameters / 1e6:,.0f} M, {shape['num_hidden_layers']} layers"
        model.save_pretrained(folder)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return load_memory.rows([folder], str(device), name_of=lambda _: name)[0]


def peak_gib(device: torch.device) -> str:
    return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f}" if device.type == "cuda" else "-"


def prompt_ids(length: int, vocab: int) -> list[int]:
    generator = torch.Generator().manual_seed(length)
    return torch.randint(10, vocab - 1, (length,), generator=generator).tolist()


@torch.inference_mode()
def prefill_rows(model, contexts: list[int], budget_of: dict[int, int]) -> list[list]:
    """Seconds and peak memory of one prefill per context: plain transformers, full, SnapStream."""
    device, rows = model.device, []
    for context in contexts:
        ids = prompt_ids(context, model.config.vocab_size)
        for name, make in [
            ("plain transformers", DynamicCache),
            ("full", lambda: build_cache({"method": "full"})),
            (f"snapstream {budget_of[context]}", lambda c=context: build_cache(snapstream(budget_of[c]))),
        ]:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            synchronize(device)
            start = time.perf_counter()
            if name == "plain transformers":
                model(
                    input_ids=torch.tensor([ids], device=device),
                    logits_to_keep=1,
                    **{cache_keyword(model): make()},
                )
            else:
                prefill_logits(model, ids, make())
            synchronize(device)
            rows.append([context, name, f"{time.perf_counter() - start:.3f}", peak_gib(device)])
    return rows


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second a large device-to-device copy moves (read + written), the best of five: the rate
    at which a step can read what it must."""
    source = torch.empty(2**28 if device.type == "cuda" else 2**24, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() / best


@torch.inference_mode()
def decode_row(model, context: int, cache: dict, rows: int, args, mode: str, attention: str, profile):
    """One decode measurement: ``rows`` rows of ``cache`` after a ``context``-token prompt, ``args.steps``
    new tokens, the step run as ``run.compile`` = ``mode`` and ``run.decode_attention`` = ``attention``;
    then, with a ``profile`` (a :class:`StepProfile`), a run of as many under the profiler (ticked by
    row 0). Returns (the attention that ran, the row's columns)."""
    ids = tuple(prompt_ids(context, model.config.vocab_size))
    requests = [Request(ids, cache, args.steps, tag=row) for row in range(rows)]  # one shared prefill
    batcher = ContinuousBatcher(model, rows, mode, decode_attention=attention, kv_dtype=cache.get("kv_dtype"))
    batcher.reserve(requests)
    start = time.perf_counter()
    batcher.run([Request(ids, cache, 3, tag="warm-up")], lambda answer: None)
    warm = time.perf_counter() - start
    batcher.steps, batcher.step_seconds = 0, 0.0
    answers = []
    batcher.run(requests, answers.append)
    ms = 1000 * batcher.step_seconds / batcher.steps
    if profile is not None:  # every row stops once row 0 has ticked the profile through its steps
        with profile:
            stops = [profile.tick, *[lambda _: profile.written] * (rows - 1)]
            profiled = [
                Request(ids, cache, args.steps, should_stop=stop, tag=row) for row, stop in enumerate(stops)
            ]
            batcher.run(profiled, lambda answer: None)
    kv = sum(answer.kv_bytes for answer in answers)
    ran = "split" if batcher.slots.split_decode else "grouped"
    return ran, gpu_peer.columns(model, kv, rows, mode, warm, ms, args.bandwidth)


def decode_rows(model, args, budget_of: dict[int, int]) -> list[list]:
    """Per context: the full cache, its rows with FP8 slots and SnapStream at equal KV memory in every
    compile mode, then the transformers peers on the full cache's rows."""
    rows = []
    for context, full_rows in zip(args.contexts, args.full_rows, strict=True):
        budget = budget_of[context]
        settings = [
            ("full", {"method": "full"}, full_rows),
            ("full fp8_e4m3", {"method": "full", "kv_dtype": "fp8_e4m3"}, full_rows),
            (f"snapstream {budget}", snapstream(budget), full_rows * context // budget),
        ]
        for (name, cache, count), mode, attention in itertools.product(
            settings, args.compile_modes, args.decode_attention
        ):
            title = f"{context} tokens, {name}, {count} rows, compile {mode}, attention {attention}"
            profile = setting_profile(args, title)
            ran, measured = decode_row(model, context, cache, count, args, mode, attention, profile)
            rows.append([context, f"{name} ({ran})", *measured])
        ids = prompt_ids(context, model.config.vocab_size)
        for name, mode in gpu_peer.peers(args.compile_modes):
            profile = setting_profile(args, f"{context} tokens, {name}, {full_rows} rows, compile {mode}")
            measured = gpu_peer.decode_peer(model, ids, full_rows, args.steps, mode, args.bandwidth, profile)
            rows.append([context, name, *measured])
    return rows


COMPILE_MODES = ("off", "on", "graphs")  # the run.compile values the decode table times (graphs: CUDA only)
PER_CONTEXT = {"budgets": ({8192: 1024}, 4096), "full_rows": ({131072: 1}, 4)}  # ({context: default}, else)


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="CPU stand-in sizes, compile off (CI)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768, 131072])
    each = "one for every context or one per context"
    parser.add_argument(
        "--budgets", type=int, nargs="+", help=f"SnapStream's, {each} (1024 at 8k, else 4096)"
    )
    parser.add_argument(
        "--full-rows",
        type=int,
        nargs="+",
        help=f"full-cache rows, {each} (4, at 128k 1); SnapStream: rows x context / budget, equal KV memory",
    )
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed per setting")
    parser.add_argument(
        "--compile",
        nargs="+",
        choices=[*COMPILE_MODES, "both"],
        help="the decode step's run.compile modes; both: all of them (default; smoke: off)",
    )
    parser.add_argument(
        "--decode-attention",
        nargs="+",
        default=["auto"],
        choices=["auto", "grouped", "split"],
        help="the engine's run.decode_attention values the decode table times (default: auto)",
    )
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="write each decode setting's top kernels here"
    )
    args = parser.parse_args(argv)
    if args.smoke:  # stand-ins for 8k/32k (4 full rows) and 128k (1 full row): 8 SnapStream rows each
        args.contexts, args.budgets, args.full_rows, args.steps = [512, 1024], [128], [2, 1], 8
    # 2 steps: the prefill's token and one decoded, which the step times are of
    at_least(args, {"--contexts": 1, "--budgets": 1, "--full-rows": 1, "--steps": 2})
    if args.profile is not None and args.steps < LEAST_TOKENS:
        raise SnapevalError(f"must be >= {LEAST_TOKENS} with --profile, got {args.steps}", "--steps")
    compile_modes = args.compile or (["off"] if args.smoke else ["both"])
    args.compile_modes = [m for m in COMPILE_MODES if m in compile_modes or "both" in compile_modes]
    args.device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.device.type != "cuda":  # CUDA graphs need a GPU
        args.compile_modes = [mode for mode in args.compile_modes if mode != "graphs"]
    for flag, (given, otherwise) in PER_CONTEXT.items():
        values = getattr(args, flag) or [given.get(context, otherwise) for context in args.contexts]
        values = values * len(args.contexts) if len(values) == 1 else values
        if len(values) != len(args.contexts):
            message = f"give {each}, got {len(values)} for {len(args.contexts)} contexts"
            raise SnapevalError(message, f"--{flag.replace('_', '-')}")
        setattr(args, flag, values)
    for context, budget, full_rows in zip(args.contexts, args.budgets, args.full_rows, strict=True):
        cache_setting(snapstream(budget), {"budget": "--budgets"})
        if full_rows * context < budget:  # no SnapStream row at the full cache's KV memory
            message = f"must be at most the {full_rows} full row(s) x {context} tokens it is compared with"
            raise SnapevalError(f"{message}, got {budget}", "--budgets")
    return args


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    device = args.device
    budget_of = dict(zip(args.contexts, args.budgets, strict=True))
    transformers.utils.logging.disable_progress_bar()
    torch._dynamo.config.recompile_limit = 64  # every setting compiles the same step function anew
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    shape = LLAMA_8B if device.type == "cuda" else STAND_IN
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    versions = f"torch {torch.__version__}  transformers {transformers.__version__}"
    args.header = f"{time.strftime('%Y-%m-%d %H:%M')}  {name}  {versions}"
    print(args.header)
    model = build(shape, dtype, device)
    parameters = sum(p.numel() for p in model.parameters())
    args.bandwidth = copy_bandwidth(device)
    print(
        f"model: Llama {parameters / 1e6:,.1f} M parameters, {dtype}; copy {args.bandwidth / 1e9:.0f} GB/s\n"
    )
    print(
        tabulate(
            prefill_rows(model, args.contexts, budget_of), headers=["context", "prefill", "s", "peak GiB"]
        )
    )
    headers = ["context", "decode", "KV MiB/row", "rows", "compile", "warm-up s", "ms/step", "tokens/s"]
    print()
    print(tabulate(decode_rows(model, args, budget_of), headers=[*headers, "floor ms", "vs floor"]))
    if args.profile is not None:
        print(f"profiles: top {TOP} kernels per step of each decode setting in {args.profile}/")
    del model
    print()
    shapes = [(count, context) for context, count in zip(args.contexts, args.full_rows, strict=True)]
    shapes += [(full * context // budget_of[context], budget_of[context]) for full, context in shapes]
    shapes = list(dict.fromkeys(shapes))  # SnapStream's rows at 32k and 128k hold alike
    heads = (shape["num_attention_heads"], shape["num_key_value_heads"], 128)
    attention = attention_rows(shapes, heads, dtype, device, args.bandwidth)
    print(tabulate(attention, headers=["rows", "slots", "decode attention", "ms/layer", "K+V read ms", "vs"]))
    print()
    checks = exactness(
        build(SMALL, torch.float32, device), prompt_ids(200, SMALL["vocab_size"]), args.compile_modes
    )
    print(tabulate(checks, headers=["exactness (small float32 model)", ""]))
    print()
    load_shape = LOAD if device.type == "cuda" else STAND_IN
    print(tabulate(load_rows(load_shape, dtype, device), headers=load_memory.HEADERS, disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
