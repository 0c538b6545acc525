"""The engine's equalities on the device ``benchmarks/gpu.py`` measures, and the decode attentions alone.

* :func:`exactness`, on a small float32 model: the full cache == plain transformers, SnapStream at a
  budget holding the prompt == full, batched rows == each alone in every compile mode (``graphs``: the
  CUDA-graph capture of ``run.compile=graphs``, token for token), the split-KV rows == each alone; and
  for both decode attentions in bf16, the same bits on re-run and whatever the other rows hold, and the
  split one within bf16 rounding of a float64 reference.
* :func:`attention_rows`: one decode token's attention alone at the decode table's shapes (rows x held
  slots, Llama-3.1-8B's heads, bf16 on CUDA), grouped SDPA vs split-KV, ms per layer call against the
  time to read the held keys and values once: the measurement ``run.decode_attention=auto`` rests on.
"""

from __future__ import annotations

import statistics
import time

import torch
from gpu_profile import synchronize

from snapeval.cache import build_cache
from snapeval.cache.decode_attention import grouped_decode_attention, split_decode_attention
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.generation import generate

ATTENTIONS = {"grouped": grouped_decode_attention, "split": split_decode_attention}


def snapstream(budget: int) -> dict:
    return {"method": "snapstream", "budget": budget, "window": 32, "ring": min(64, budget // 4)}


@torch.inference_mode()
def exactness(model, ids: list[int], compile_modes: list[str]) -> list[list]:
    """(check, PASS/FAIL) of the engine's equalities on ``model`` (small, float32, installed)."""
    device = model.device
    caches = {"full": {"method": "full"}, "holding": snapstream(512), "small": snapstream(96)}
    alone = {
        name: generate(model, ids, build_cache(cache), 16, set()).tokens for name, cache in caches.items()
    }
    plain = model.generate(torch.tensor([ids], device=device), max_new_tokens=16, do_sample=False)[0]
    results = [
        ["full cache == plain transformers (16 greedy tokens)", alone["full"] == plain[len(ids) :].tolist()],
        ["SnapStream holding the prompt == full", alone["holding"] == alone["full"]],
    ]
    runs = [(mode, "auto") for mode in sorted({"off", *compile_modes})] + [("off", "split")]
    for mode, attention in runs:
        answers: list = []
        requests = [Request(tuple(ids), cache, 16, tag=name) for name, cache in caches.items()]
        ContinuousBatcher(model, 3, mode, decode_attention=attention).run(requests, answers.append)
        same = all(answer.tokens == alone[answer.request.tag] for answer in answers) and len(answers) == 3
        results.append([f"batched rows == each alone (compile {mode}, attention {attention})", same])
    results += attention_checks(device)
    return [[check, "PASS" if passed else "FAIL"] for check, passed in results]


def attention_checks(device: torch.device) -> list[list]:
    """Both decode attentions in bf16: same bits on 50 re-runs and whatever the other rows hold; split
    within bf16 rounding of a float64 reference."""
    generator = torch.Generator(device=device).manual_seed(0)
    query = torch.randn(4, 32, 1, 128, generator=generator, device=device, dtype=torch.bfloat16)
    key, value = (
        torch.randn(4, 8, 2048, 128, generator=generator, device=device, dtype=torch.bfloat16) for _ in "kv"
    )
    mask = torch.rand(4, 1, 1, 2048, generator=generator, device=device) < 0.9
    others = [tensor.clone() for tensor in (query, key, value)]
    for tensor in others:
        tensor[1:].normal_()
    results = []
    for name, attention in ATTENTIONS.items():
        first = attention(query, key, value, mask, 128**-0.5)
        rerun = all(torch.equal(first, attention(query, key, value, mask, 128**-0.5)) for _ in range(50))
        results.append([f"{name} decode attention: same bits on 50 re-runs (bf16)", rerun])
        row = torch.equal(first[0], attention(*others, mask, 128**-0.5)[0])
        results.append([f"{name} decode attention: a row's bits whatever the others hold", row])
    reference = grouped_decode_attention(*(t.double() for t in (query, key, value)), mask, 128**-0.5)
    split = split_decode_attention(query, key, value, mask, 128**-0.5).double()
    close = torch.allclose(split, reference, atol=1e-2, rtol=2**-6)
    results.append(["split decode attention within bf16 rounding of float64", close])
    return results


@torch.inference_mode()
def attention_rows(shapes: list[tuple[int, int]], heads: tuple[int, int, int], dtype, device, bandwidth):
    """ms per call of each decode attention over (rows, slots) held slots, and its ratio to reading the
    held keys and values once at ``bandwidth``; ``heads``: (query heads, KV heads, head_dim)."""
    query_heads, kv_heads, dim = heads
    table = []
    for rows, slots in shapes:
        generator = torch.Generator(device=device).manual_seed(slots)
        query = torch.randn(rows, query_heads, 1, dim, generator=generator, device=device, dtype=dtype)
        key, value = (
            torch.randn(rows, kv_heads, slots, dim, generator=generator, device=device, dtype=dtype)
            for _ in "kv"
        )
        mask = torch.rand(rows, 1, 1, slots, generator=generator, device=device) < 0.95
        floor_ms = 1000 * 2 * key.numel() * key.element_size() / bandwidth
        for name, attention in ATTENTIONS.items():
            ms = median_ms(attention, (query, key, value, mask, dim**-0.5), device)
            table.append([rows, slots, name, f"{ms:.3f}", f"{floor_ms:.3f}", f"{ms / floor_ms:.1f}x"])
    return table


def median_ms(call, arguments: tuple, device: torch.device, repeats: int = 20) -> float:
    """Median milliseconds of ``call(*arguments)`` over ``repeats`` timed calls after 3 warm-up calls."""
    for _ in range(3):
        call(*arguments)
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        call(*arguments)
        synchronize(device)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)
