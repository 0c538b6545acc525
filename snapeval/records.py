"""What a scored sample's row holds: its output and score, its calls' costs, how its trace ended and
how far it agrees with the full cache's output. Pure functions of finished answers (no database)."""

from __future__ import annotations

import resource
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from snapeval.continuous import Answer
from snapeval.tasks import Prompt, Task


def answer_text(tokenizer: PreTrainedTokenizerBase, answer: Answer, skip_special_tokens: bool = True) -> str:
    return tokenizer.decode(answer.tokens, skip_special_tokens=skip_special_tokens)


def fidelity(tokenizer, output: str, reference: str) -> dict[str, Any]:
    """Agreement of an output with the full cache's: exact match and the common token prefix."""
    ours = tokenizer(output, add_special_tokens=False)["input_ids"]
    theirs = tokenizer(reference, add_special_tokens=False)["input_ids"]
    pairs = zip(ours, theirs, strict=False)
    common = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(ours), len(theirs)))
    return {"exact": output == reference, "common_prefix_tokens": common, "reference_tokens": len(theirs)}


def trace(tokenizer: PreTrainedTokenizerBase, answer: Answer) -> dict[str, Any]:
    """How a (reasoning) trace ended: its length, whether it hit ``max_new_tokens``, whether the
    reasoning closed (``</think>`` appeared), and how often the cache's ring wrapped."""
    return {
        "generated_tokens": len(answer.tokens),
        "stopped": answer.stopped,
        "truncated": answer.stopped == "length",
        "reasoning_closed": "</think>" in answer_text(tokenizer, answer, skip_special_tokens=False),
        "ring_wraps": answer.ring_wraps,
    }


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process peak RSS so far


def sample_row(
    task: Task,
    prompt: Prompt,
    calls: list[Answer],
    reference: str | None,
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
) -> dict[str, Any]:
    """The stored row of a prompt whose last call ended: its final output scored, its calls' seconds
    and token counts added up, its KV bytes the largest of its calls'; ``prompt_tokens``, the kept
    histogram and the trace describe the first (long-context) call. ``reference``: the full cache's
    output of the same sample, when known."""
    first, output = calls[0], answer_text(tokenizer, calls[-1])
    metrics = task.score(prompt, output)
    prompt_ids, compress_at = first.request.prompt_ids, first.request.compress_at
    extra = {**prompt.metadata, "compressed_prompt_tokens": compress_at or len(prompt_ids)}
    extra["trace"] = trace(tokenizer, first)
    if first.kept_histogram is not None:
        extra["kept_histogram"] = first.kept_histogram
        extra["kept_share"] = first.kept_share
    if task.answer_pass:
        extra["reasoning"] = answer_text(tokenizer, first)
        extra["calls"] = [_call_record(c) for c in calls]
    if reference is not None:
        extra["fidelity"] = fidelity(tokenizer, output, reference)
    return {
        "sample_id": prompt.id,
        "prompt_tokens": len(prompt_ids),
        "output": output,
        "target": prompt.target,
        "score": metrics["score"],
        "metrics": metrics,
        "prefill_s": sum(c.prefill_s for c in calls),
        "decode_s": sum(c.decode_s for c in calls),
        "generated_tokens": sum(len(c.tokens) for c in calls),
        "peak_memory_bytes": peak_memory_bytes(device),
        "kv_bytes": max(c.kv_bytes for c in calls),
        "extra": extra,
    }


def _call_record(made: Answer) -> dict[str, Any]:
    return {
        "prompt_tokens": len(made.request.prompt_ids),
        "generated_tokens": len(made.tokens),
        "stopped": made.stopped,
        "prefill_s": made.prefill_s,
        "decode_s": made.decode_s,
        "kv_bytes": made.kv_bytes,
    }
