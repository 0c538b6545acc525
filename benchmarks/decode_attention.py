"""One decode step's attention over held slots: the engine's grouped attention vs transformers' paths.

At one query token per row over ``--rows`` rows of ``--slots`` held slots, with the boolean mask of
which slots each row holds (the engine always passes one at decode), it times, in one run:

* ``repeat_kv``: every KV head copied to its query heads, then SDPA with the mask (transformers' SDPA
  path with a mask under ``torch.compile``, and eager before it packed GQA);
* ``enable_gqa``: SDPA's own GQA flag with the mask;
* ``grouped``: :func:`snapeval.cache.decode_attention.grouped_decode_attention` (each KV head's query heads
  stacked as its query rows: every held byte read once);
* ``split``: :func:`snapeval.cache.decode_attention.split_decode_attention` (the same attention over
  chunks of ``SPLIT_CHUNK`` slots combined by log-sum-exp, float32 softmax: built for a GPU's SMs);

and, for MLA at DeepSeek-V2-Lite's geometry, the model's ``expand_kv`` of every held latent then SDPA vs
:func:`snapeval.cache.mla.absorbed_decode_attention` (attention in latent space).

Medians over ``--repeats`` rounds, each round running every variant in turn (every other round in
reverse), printed as ms per call and as the ratio to ``repeat_kv``. Default shape: SmolLM2-135M's
(9 query heads, 3 KV heads, head_dim 64), float32 on CPU. ``--smoke`` runs a tiny shape once.

    python benchmarks/decode_attention.py                      # rows 4 and 8 x slots 4096 and 8192
    python benchmarks/decode_attention.py --heads 32 --kv-heads 8 --head-dim 128 --rows 32 --slots 1024
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from arguments import at_least
from machine import available_cores, cpu_model
from tabulate import tabulate

from snapeval.cache.decode_attention import grouped_decode_attention, split_decode_attention
from snapeval.cli import one_line_errors
from snapeval.errors import SnapevalError


def variants(kv_heads: int, heads: int) -> dict[str, Callable]:
    group = heads // kv_heads

    def repeat_kv(query, key, value, mask, scaling):
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)

    def enable_gqa(query, key, value, mask, scaling):
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True
        )

    return {
        "repeat_kv": repeat_kv,
        "enable_gqa": enable_gqa,
        "grouped": grouped_decode_attention,
        "split": split_decode_attention,
    }


def measure(args: argparse.Namespace, rows: int, slots: int) -> list[list]:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(rows, args.heads, 1, args.head_dim, generator=generator)
    key = torch.randn(rows, args.kv_heads, slots, args.head_dim, generator=generator)
    value = torch.randn(rows, args.kv_heads, slots, args.head_dim, generator=generator)
    mask = torch.rand(rows, 1, 1, slots, generator=generator) < 0.9
    scaling = args.head_dim**-0.5
    calls = variants(args.kv_heads, args.heads)
    reference = calls["repeat_kv"](query, key, value, mask, scaling).transpose(1, 2)
    timings: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(args.repeats):
        order = list(calls) if round_ % 2 == 0 else list(reversed(calls))
        for name in order:
            start = time.perf_counter()
            for _ in range(args.calls):
                output = calls[name](query, key, value, mask, scaling)
            timings[name].append((time.perf_counter() - start) / args.calls * 1e3)
            if name in ("grouped", "split"):
                torch.testing.assert_close(output, reference, atol=1e-5, rtol=1e-5)
    base = statistics.median(timings["repeat_kv"])
    return [
        [rows, slots, name, f"{statistics.median(times):.3f}", f"{statistics.median(times) / base:.2f}x"]
        for name, times in timings.items()
    ]


V2_LITE = {  # DeepSeek-V2-Lite's attention geometry, 2 dense layers
    "hidden_size": 2048,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 2,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 1024,
}


def measure_mla(args: argparse.Namespace, rows: int, slots: int) -> list[list]:
    """MLA at decode: expanding every held latent to per-head keys and values (the model's expand_kv,
    then SDPA with the mask) vs attending in latent space (:func:`absorbed_decode_attention`)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from snapeval.cache import attention, install
    from snapeval.cache.mla import absorbed_decode_attention

    torch.manual_seed(0)
    model = install(DeepseekV3ForCausalLM(DeepseekV3Config(**V2_LITE)).eval())
    module = model.model.layers[0].self_attn
    expand, projections = vars(module)[attention.EXPAND_LATENT], vars(module)[attention.UP_PROJECTIONS]
    heads, rank, rope = module.config.num_attention_heads, module.kv_lora_rank, module.qk_rope_head_dim
    query = torch.randn(rows, heads, 1, module.qk_nope_head_dim + rope)
    latent, rotary = torch.randn(rows, 1, slots, rank), torch.randn(rows, 1, slots, rope)
    mask = torch.rand(rows, 1, 1, slots) < 0.9

    def expanded():
        keys, values = expand(latent, rotary)
        output = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=module.scaling)
        return output.transpose(1, 2)

    def absorbed():
        return absorbed_decode_attention(query, latent, rotary, mask, module.scaling, projections)

    calls = {"expand_kv + SDPA": expanded, "absorbed": absorbed}
    timings: dict[str, list[float]] = {name: [] for name in calls}
    with torch.inference_mode():
        torch.testing.assert_close(absorbed(), expanded(), atol=1e-4, rtol=1e-4)
        for round_ in range(args.repeats):
            for name in list(calls) if round_ % 2 == 0 else list(reversed(calls)):
                start = time.perf_counter()
                for _ in range(args.calls):
                    calls[name]()
                timings[name].append((time.perf_counter() - start) / args.calls * 1e3)
    base = statistics.median(timings["expand_kv + SDPA"])
    return [
        [
            rows,
            slots,
            f"MLA {name}",
            f"{statistics.median(t):.3f}",
            f"{base / statistics.median(t):.2f}x faster",
        ]
        for name, t in timings.items()
    ]


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--slots", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="calls per timing")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--smoke", action="store_true", help="a tiny shape, one round (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.slots, args.repeats, args.calls = [2], [64], 1, 1
    positive = (
        "--rows",
        "--slots",
        "--heads",
        "--kv-heads",
        "--head-dim",
        "--repeats",
        "--calls",
        "--threads",
    )
    at_least(args, dict.fromkeys(positive, 1))
    if args.heads % args.kv_heads:
        raise SnapevalError(f"must divide --heads ({args.heads}), got {args.kv_heads}", "--kv-heads")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}  {cpu_model()}  {available_cores()} cores, "
        f"{torch.get_num_threads()} torch threads  torch {torch.__version__}  {platform.python_version()}"
    )
    print(f"heads {args.heads}, KV heads {args.kv_heads}, head_dim {args.head_dim}, float32; ms per call")
    table = [line for rows in args.rows for slots in args.slots for line in measure(args, rows, slots)]
    print(tabulate(table, headers=["rows", "slots", "attention", "ms", "vs repeat_kv"]))
    print(
        "\nMLA, DeepSeek-V2-Lite geometry (16 heads, kv_lora_rank 512, rope 64, v 128), float32; ms per call"
    )
    table = [line for rows in args.rows for slots in args.slots for line in measure_mla(args, rows, slots)]
    print(tabulate(table, headers=["rows", "slots", "attention", "ms", "vs expanding"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
