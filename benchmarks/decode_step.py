"""The batcher's eager decode step on CPU at SmolLM2-135M's shape: slot writes as they were (``scatter_``)
vs as they are (``index_put_``), and the grouped vs the split-KV decode attention, in one run.

Random weights at SmolLM2-135M-Instruct's geometry (30 layers, hidden 576, 9 query / 3 KV heads of 64),
float32. Per (rows, slots): one prompt of ``slots + 512`` tokens is prefilled once into a SnapStream cache
of ``slots`` slots and loaded into every row; then the same rows are stepped with each variant in turn
(every other round in reverse) and the median ms per step is printed with its ratio to the first:

* ``scatter_ + grouped``: the step before issue 46 (slot writes by ``scatter_``, grouped SDPA);
* ``index_put_ + grouped``: the CPU default now;
* ``index_put_ + split``: the split-KV attention (``run.decode_attention=split``, a GPU's default).

    python benchmarks/decode_step.py                 # rows 4 and 8 x slots 4096 and 8192
    python benchmarks/decode_step.py --smoke         # a tiny shape, once (CI)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Sequence

import torch
from arguments import at_least, cache_setting
from machine import available_cores, cpu_model
from tabulate import tabulate
from transformers import LlamaConfig, LlamaForCausalLM

from snapeval.cache import build_cache, install, slots
from snapeval.cache.slots import cached_shapes
from snapeval.cli import one_line_errors
from snapeval.decode.continuous import ContinuousBatcher
from snapeval.decode.continuous.classes import RowClasses
from snapeval.decode.continuous.rows import RowSampling
from snapeval.decode.generation import prefill_logits

SMOLLM2 = {  # SmolLM2-135M-Instruct's geometry
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 16384,
}
TINY = {**SMOLLM2, "vocab_size": 512, "hidden_size": 72, "intermediate_size": 128, "num_hidden_layers": 2}


def snapstream(capacity: int) -> dict:
    """The SnapStream cache of ``capacity`` slots that every row holds."""
    return {"method": "snapstream", "budget": capacity, "window": 32, "ring": min(64, capacity // 4)}


def scatter_writes(buffers, slots_: torch.Tensor, states, lead=None) -> None:
    """The slot writes before issue 46: ``scatter_`` along the slot axis (``lead``, the row and head
    indices of today's writes, unused)."""
    for buffer, state in zip(buffers, states, strict=True):
        index = slots_[:, None, :].expand(state.shape[0], state.shape[1], -1)
        if buffer.dim() == 4:
            index = index[..., None].expand(-1, -1, -1, buffer.shape[-1])
        buffer.scatter_(2, index, state)


VARIANTS = {  # name: (slot write, split-KV attention)
    "scatter_ + grouped": (scatter_writes, False),
    "index_put_ + grouped": (slots.write_slots, False),
    "index_put_ + split": (slots.write_slots, True),
}


@torch.inference_mode()
def measure(model, rows: int, capacity: int, steps: int, rounds: int) -> list[list]:
    """Median ms per step of each variant, ``rows`` SnapStream rows of ``capacity`` slots."""
    generator = torch.Generator().manual_seed(capacity)
    ids = torch.randint(10, model.config.vocab_size, (capacity + 512,), generator=generator).tolist()
    cache = build_cache(snapstream(capacity))
    prefill_logits(model, ids, cache)
    row_classes = RowClasses.for_model(model, [(capacity, rows)], cached_shapes(model))
    for row in range(rows):
        row_classes.load_row(row, cache, 0)
    batcher = ContinuousBatcher(model, rows)
    sampling = RowSampling.empty(rows, model.device)
    tokens = torch.zeros(rows, dtype=torch.long)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    original = slots.write_slots
    try:
        for round_ in range(rounds):
            for name in list(VARIANTS)[:: -1 if round_ % 2 else 1]:
                slots.write_slots, row_classes.split_decode = VARIANTS[name]
                batcher.step(row_classes, tokens, sampling)  # warm
                start = time.perf_counter()
                for _ in range(steps):
                    batcher.step(row_classes, tokens, sampling)
                times[name].append(1000 * (time.perf_counter() - start) / steps)
    finally:
        slots.write_slots = original
    base = statistics.median(times[next(iter(VARIANTS))])
    return [
        [rows, capacity, name, f"{statistics.median(ms):.2f}", f"{statistics.median(ms) / base:.2f}"]
        for name, ms in times.items()
    ]


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--slots", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--steps", type=int, default=8, help="steps timed per variant and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a tiny shape, one round (CI)")
    args = parser.parse_args(argv)
    shape = TINY if args.smoke else SMOLLM2
    if args.smoke:
        args.rows, args.slots, args.steps, args.rounds = [2], [64], 2, 1
    at_least(args, {"--rows": 1, "--slots": 1, "--steps": 1, "--rounds": 1})
    for capacity in args.slots:
        cache_setting(snapstream(capacity), {"budget": "--slots"})
    torch.manual_seed(0)
    model = install(LlamaForCausalLM(LlamaConfig(**shape)).eval())
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}  {cpu_model() or platform.processor()}, {available_cores()} cores"
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
        f"{shape['num_hidden_layers']} layers\n"
    )
    table = [
        line
        for rows in args.rows
        for slots_ in args.slots
        for line in measure(model, rows, slots_, args.steps, args.rounds)
    ]
    print(tabulate(table, headers=["rows", "slots", "step", "ms/step", "vs before"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
