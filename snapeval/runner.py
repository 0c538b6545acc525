"""Compose model + cache + task, run every sample not yet stored, record it, and summarize.

The runner knows no compression method (it asks :func:`snapeval.cache.build_cache`) and no task
(it asks :func:`snapeval.tasks.load_task`). Each scored sample is committed to the results database as
soon as it is done, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import resource
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from tabulate import tabulate
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from snapeval.cache import build_cache, install
from snapeval.continuous import Answer, ContinuousBatcher, Request, check_compile
from snapeval.errors import SnapevalError
from snapeval.models import ModelSpec, load_model, load_tokenizer
from snapeval.prompting import encode_with_split, fit_to_window
from snapeval.results import ResultsDB, config_hash
from snapeval.sampling import Sampling
from snapeval.stats import mean_ci
from snapeval.tasks import AnswerPass, EvalTask, Prompt, load_task

#: The random number generator of sampled answers (:mod:`snapeval.sampling`), stored with sampled runs.
SAMPLER = "counter-hash-v1"


@dataclass(frozen=True)
class RunSummary:
    run_id: int
    config_hash: str
    n: int
    accuracy: float
    ci_low: float
    ci_high: float
    kv_mib: float
    prefill_s: float
    decode_tok_s: float
    computed: int


def check_config(cfg: Mapping[str, Any]) -> None:
    """Reject impossible values before any model work, one field at a time."""
    task = cfg["task"]
    limit = task.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit <= 0):
        raise SnapevalError(f"must be a positive integer or null, got {limit}", "task.limit")
    for key in ("context_length", "num_samples", "max_new_tokens"):
        value = task.get(key)
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise SnapevalError(f"must be a positive integer, got {value}", f"task.{key}")
    for key in ("num_samples", "batch_size"):
        value = cfg["generation"][key]
        if not isinstance(value, int) or value <= 0:
            raise SnapevalError(f"must be a positive integer, got {value}", f"generation.{key}")
    max_new = cfg["generation"].get("max_new_tokens")
    if max_new is not None and (not isinstance(max_new, int) or max_new <= 0):
        raise SnapevalError(f"must be a positive integer or null, got {max_new}", "generation.max_new_tokens")
    if cfg["generation"]["do_sample"] and cfg["generation"]["temperature"] <= 0:
        raise SnapevalError("must be > 0 when sampling", "generation.temperature")
    check_compile(cfg["generation"]["compile"])
    AnswerPass.from_config(task.get("answer_pass"))


def stored_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config as recorded with results: the cache reduced to its effective parameters, no db URL."""
    stored = {key: value for key, value in cfg.items() if key not in ("db", "hydra", "memory", "job")}
    stored["cache"] = build_cache(cfg["cache"], strict=False).params()
    if cfg["generation"]["do_sample"]:  # sampled answers come from this generator: not mixed on resume
        stored["generation"] = {**cfg["generation"], "rng": SAMPLER}
    return stored


def draws(prompts: list[Prompt], num_samples: int) -> list[Prompt]:
    """Each prompt ``num_samples`` times (ids ``<id>#<k>``) for pass@1 over n sampled answers."""
    if num_samples == 1:
        return prompts
    return [
        replace(prompt, id=f"{prompt.id}#{k}", metadata={**prompt.metadata, "problem": prompt.id, "draw": k})
        for prompt in prompts
        for k in range(num_samples)
    ]


def _sample_seed(seed: int, sample_id: str) -> int:
    return seed * 1_000_003 + zlib.crc32(sample_id.encode())


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process peak RSS so far


def run(cfg: Mapping[str, Any]) -> RunSummary:
    """Evaluate the configured model, cache and task; store every sample; return the summary."""
    with ResultsDB(cfg["db"]["url"]) as db:
        try:
            check_config(cfg)
            config = stored_config(cfg)  # builds one cache: bad cache parameters fail here, before loading
        except SnapevalError as exc:  # recorded, so that a sweep's summary shows the failed point
            raw = {key: value for key, value in cfg.items() if key not in ("db", "hydra", "memory", "job")}
            db.finish_run(db.start_run(raw, config_hash(raw)), "failed", str(exc))
            raise
        digest = config_hash(config)
        spec = ModelSpec.from_config(cfg["model"])
        tokenizer = load_tokenizer(spec)
        task = load_task(cfg["task"], cfg["seed"])
        prompts = draws(task.prompts(tokenizer)[: cfg["task"].get("limit")], cfg["generation"]["num_samples"])
        done = db.done_sample_ids(digest)
        todo = [prompt for prompt in prompts if prompt.id not in done]
        run_id = db.start_run(config, digest)
        try:
            if todo:
                reference = _full_cache_outputs(db, config)
                _evaluate(cfg, spec, task, todo, db, run_id, digest, reference)
        except KeyboardInterrupt:
            db.finish_run(run_id, "interrupted")
            raise
        except Exception as exc:
            db.finish_run(run_id, "failed", f"{type(exc).__name__}: {exc}")
            raise
        db.finish_run(run_id, "finished")
        wanted = {prompt.id for prompt in prompts}
        rows = [row for row in db.samples_for(digest) if row["sample_id"] in wanted]
    return _summarize(run_id, digest, rows, computed=len(todo))


def _full_cache_outputs(db: ResultsDB, config: Mapping[str, Any]) -> dict[str, str]:
    """Outputs of the full-cache run of the same model/task/samples, when stored (else empty)."""
    if config["cache"]["method"] == "full":
        return {}
    full = {**config, "cache": build_cache({"method": "full"}).params()}
    return {row["sample_id"]: row["output"] for row in db.samples_for(config_hash(full))}


def fidelity(tokenizer, output: str, reference: str) -> dict[str, Any]:
    """Agreement of an output with the full cache's: exact match and the common token prefix."""
    ours = tokenizer(output, add_special_tokens=False)["input_ids"]
    theirs = tokenizer(reference, add_special_tokens=False)["input_ids"]
    pairs = zip(ours, theirs, strict=False)
    common = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(ours), len(theirs)))
    return {"exact": output == reference, "common_prefix_tokens": common, "reference_tokens": len(theirs)}


def _evaluate(
    cfg: Mapping[str, Any],
    spec: ModelSpec,
    task: EvalTask,
    todo: list[Prompt],
    db: ResultsDB,
    run_id: int,
    digest: str,
    reference: Mapping[str, str],
) -> None:
    """Generate, score and store each prompt through the continuous batcher; a two-pass task's answer
    call is queued as soon as its first call ends.

    ``generation.batch_size`` rows decode together; a row that ends takes the next request at once, and
    the draws of one problem share one prefill. Each sample is committed the moment its last call ends.
    A sample's timings and token counts add up its calls, its KV bytes are the larger of its calls';
    ``prompt_tokens``, the kept histogram and the trace fields describe the first (long-context) call.
    """
    model = install(load_model(spec))
    tokenizer = load_tokenizer(spec)
    generation_cfg = cfg["generation"]
    max_new_tokens = generation_cfg.get("max_new_tokens") or task.max_new_tokens
    stop_ids = frozenset(_stop_ids(tokenizer.eos_token_id, model.generation_config.eos_token_id))
    cache_params = dict(cfg["cache"])
    encoded: dict[str | None, tuple[tuple[int, ...], int | None]] = {}

    def request(prompt: Prompt, messages, max_new: int, seed_key: str, calls: list[Answer]) -> Request:
        # the draws of one problem share one encoding (and, in the batcher, one prefill)
        key = str(prompt.metadata.get("problem", prompt.id)) if not calls else None
        if key is None or key not in encoded:
            fitted = fit_to_window(tokenizer, messages, spec.max_context - max_new, task.truncation)
            ids, compress_at = encode_with_split(tokenizer, fitted, task.query_start)
            encoded.clear()
            encoded[key] = (tuple(ids), compress_at)
        ids, compress_at = encoded[key]
        sampling = Sampling(
            do_sample=generation_cfg["do_sample"],
            temperature=generation_cfg["temperature"],
            top_p=generation_cfg["top_p"],
            seed=_sample_seed(cfg["seed"], seed_key),
        )
        return Request(ids, cache_params, max_new, sampling, stop_ids, compress_at, tag=(prompt, calls))

    progress = tqdm(
        total=len(todo), desc=f"{task.name} [{cfg['cache']['method']}]", disable=not cfg.get("progress", True)
    )

    def on_answer(answer: Answer) -> list[Request]:
        prompt, calls = answer.request.tag
        calls = [*calls, answer]
        if task.answer_pass and len(calls) == 1:
            messages = task.answer_pass.messages(prompt, _text(tokenizer, answer))
            max_new = task.answer_pass.max_new_tokens
            return [request(prompt, messages, max_new, f"{prompt.id}#answer", calls)]
        _store(db, run_id, digest, task, prompt, calls, reference, tokenizer, model.device)
        progress.update()
        return []

    batcher = ContinuousBatcher(model, generation_cfg["batch_size"], generation_cfg["compile"])
    requests = [request(prompt, prompt.messages, max_new_tokens, prompt.id, []) for prompt in todo]
    batcher.run(requests, on_answer)
    progress.close()


def _text(tokenizer: PreTrainedTokenizerBase, answer: Answer, skip_special_tokens: bool = True) -> str:
    return tokenizer.decode(answer.tokens, skip_special_tokens=skip_special_tokens)


def trace(tokenizer: PreTrainedTokenizerBase, answer: Answer) -> dict[str, Any]:
    """How a (reasoning) trace ended: its length, whether it hit ``max_new_tokens``, whether the
    reasoning closed (``</think>`` appeared), and how often the cache's ring wrapped."""
    return {
        "generated_tokens": len(answer.tokens),
        "stopped": answer.stopped,
        "truncated": answer.stopped == "length",
        "reasoning_closed": "</think>" in _text(tokenizer, answer, skip_special_tokens=False),
        "ring_wraps": answer.ring_wraps,
    }


def _store(
    db: ResultsDB,
    run_id: int,
    digest: str,
    task: EvalTask,
    prompt: Prompt,
    calls: list[Answer],
    reference: Mapping[str, str],
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
) -> None:
    """Score a prompt's final output and commit the sample with its calls' measurements."""
    first, output = calls[0], _text(tokenizer, calls[-1])
    metrics = task.score(prompt, output)
    prompt_ids, compress_at = first.request.prompt_ids, first.request.compress_at
    extra = {**prompt.metadata, "compressed_prompt_tokens": compress_at or len(prompt_ids)}
    extra["trace"] = trace(tokenizer, first)
    if first.kept_histogram is not None:
        extra["kept_histogram"] = first.kept_histogram
    if task.answer_pass:
        extra["reasoning"] = _text(tokenizer, first)
        extra["calls"] = [_call_record(c) for c in calls]
    if prompt.id in reference:
        extra["fidelity"] = fidelity(tokenizer, output, reference[prompt.id])
    db.add_sample(
        run_id,
        digest,
        {
            "sample_id": prompt.id,
            "prompt_tokens": len(prompt_ids),
            "output": output,
            "target": prompt.target,
            "score": metrics["score"],
            "metrics": metrics,
            "prefill_s": sum(c.prefill_s for c in calls),
            "decode_s": sum(c.decode_s for c in calls),
            "generated_tokens": sum(len(c.tokens) for c in calls),
            "peak_memory_bytes": _peak_memory_bytes(device),
            "kv_bytes": max(c.kv_bytes for c in calls),
            "extra": extra,
        },
    )


def _call_record(made: Answer) -> dict[str, Any]:
    return {
        "prompt_tokens": len(made.request.prompt_ids),
        "generated_tokens": len(made.tokens),
        "stopped": made.stopped,
        "prefill_s": made.prefill_s,
        "decode_s": made.decode_s,
        "kv_bytes": made.kv_bytes,
    }


def _stop_ids(*ids: int | list[int] | None) -> set[int]:
    """Token ids that end generation: the tokenizer's and the generation config's EOS, flattened."""
    flat: set[int] = set()
    for value in ids:
        flat.update(value if isinstance(value, list) else [value] if value is not None else [])
    return flat


def _summarize(run_id: int, digest: str, rows: list[dict[str, Any]], computed: int) -> RunSummary:
    if not rows:
        raise SnapevalError("no samples were evaluated", "task.limit")
    accuracy, low, high = mean_ci([row["score"] for row in rows])
    decode_s = sum(row["decode_s"] for row in rows)
    return RunSummary(
        run_id=run_id,
        config_hash=digest,
        n=len(rows),
        accuracy=accuracy,
        ci_low=low,
        ci_high=high,
        kv_mib=sum(row["kv_bytes"] for row in rows) / len(rows) / 2**20,
        prefill_s=sum(row["prefill_s"] for row in rows) / len(rows),
        decode_tok_s=sum(row["generated_tokens"] for row in rows) / decode_s if decode_s else float("nan"),
        computed=computed,
    )


def format_summary(cfg: Mapping[str, Any], summary: RunSummary) -> str:
    """A one-row table: what ran, accuracy with its 95% CI and n, KV memory and speed."""
    cache = build_cache(cfg["cache"], strict=False).params()
    setting = ", ".join(f"{k}={v}" for k, v in cache.items() if k != "method" and v is not None)
    row = {
        "model": cfg["model"]["name"],
        "task": cfg["task"]["name"],
        "cache": f"{cache['method']}({setting})" if setting else cache["method"],
        "accuracy": f"{summary.accuracy:.3f}",
        "95% CI": f"[{summary.ci_low:.3f}, {summary.ci_high:.3f}]",
        "n": summary.n,
        "new": summary.computed,
        "KV MiB": f"{summary.kv_mib:.1f}",
        "prefill s": f"{summary.prefill_s:.2f}",
        "decode tok/s": f"{summary.decode_tok_s:.1f}",
    }
    return tabulate([row], headers="keys", tablefmt="github")
