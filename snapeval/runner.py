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

from snapeval.cache import SnapevalCache, build_cache, install
from snapeval.errors import SnapevalError
from snapeval.generation import Generation, Sampling, generate_batch, generate_draws
from snapeval.models import ModelSpec, load_model, load_tokenizer, pad_token_id
from snapeval.prompting import encode_with_split, fit_to_window
from snapeval.results import ResultsDB, config_hash
from snapeval.stats import mean_ci
from snapeval.tasks import AnswerPass, EvalTask, Prompt, load_task


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
    for key in ("num_samples", "draw_batch", "batch_size"):
        value = cfg["generation"][key]
        if not isinstance(value, int) or value <= 0:
            raise SnapevalError(f"must be a positive integer, got {value}", f"generation.{key}")
    max_new = cfg["generation"].get("max_new_tokens")
    if max_new is not None and (not isinstance(max_new, int) or max_new <= 0):
        raise SnapevalError(f"must be a positive integer or null, got {max_new}", "generation.max_new_tokens")
    if cfg["generation"]["do_sample"] and cfg["generation"]["temperature"] <= 0:
        raise SnapevalError("must be > 0 when sampling", "generation.temperature")
    AnswerPass.from_config(task.get("answer_pass"))


def stored_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config as recorded with results: the cache reduced to its effective parameters, no db URL."""
    stored = {key: value for key, value in cfg.items() if key not in ("db", "hydra", "memory", "job")}
    stored["cache"] = build_cache(cfg["cache"], strict=False).params()
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


@dataclass
class _Call:
    """One prefill + generation: what the model was given and what came back."""

    prompt_ids: list[int]
    compress_at: int | None
    cache: SnapevalCache
    result: Generation
    output: str
    kv_bytes: int  # this answer's share of the cache (answers decoded together share one)
    row: int | None = None  # its row in a batch of different prompts, and that row's left padding
    padding: int = 0


def draw_groups(prompts: list[Prompt], size: int) -> list[list[Prompt]]:
    """Consecutive draws of one problem, at most ``size`` together (a lone prompt is its own group)."""
    groups: list[list[Prompt]] = []
    for prompt in prompts:
        problem = prompt.metadata.get("problem")
        last = groups[-1] if groups else None
        if last and problem is not None and last[0].metadata.get("problem") == problem and len(last) < size:
            last.append(prompt)
        else:
            groups.append([prompt])
    return groups


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
    """Generate, score and store each prompt; a two-pass task's answer call follows its first call.

    Draws of one problem (``generation.num_samples``) share a prefill and decode together, up to
    ``generation.draw_batch`` at a time; otherwise ``generation.batch_size`` prompts are left-padded
    into one batch (prompts split for query-agnostic compression go one by one). A sample's timings
    and token counts add up both calls, its KV bytes are the larger of its calls' (a share of a
    batch's cache); ``prompt_tokens`` and the kept histogram describe the first (long-context) call.
    """
    model = install(load_model(spec))
    tokenizer = load_tokenizer(spec)
    generation_cfg = cfg["generation"]
    max_new_tokens = generation_cfg.get("max_new_tokens") or task.max_new_tokens
    stop_ids = _stop_ids(tokenizer.eos_token_id, model.generation_config.eos_token_id)

    def sampling(seed_key: str) -> Sampling:
        return Sampling(
            do_sample=generation_cfg["do_sample"],
            temperature=generation_cfg["temperature"],
            top_p=generation_cfg["top_p"],
            seed=_sample_seed(cfg["seed"], seed_key),
        )

    def encode(
        messages: list[dict[str, str]], max_new: int, query_start: str | None
    ) -> tuple[list[int], int | None]:
        messages = fit_to_window(tokenizer, messages, spec.max_context - max_new, task.truncation)
        return encode_with_split(tokenizer, messages, query_start)

    def call(messages: list[dict[str, str]], max_new: int, seed_keys: list[str]) -> list[_Call]:
        """One prompt, one answer per seed key (draws share the prefill)."""
        prompt_ids, compress_at = encode(messages, max_new, task.query_start)
        cache = build_cache(cfg["cache"], strict=False)
        samplings = [sampling(key) for key in seed_keys]
        results = generate_draws(model, prompt_ids, cache, max_new, stop_ids, samplings, compress_at)
        kv_bytes = cache.kv_bytes() // len(results)
        return [_Call(prompt_ids, compress_at, cache, r, text(r), kv_bytes) for r in results]

    def call_batch(prompts: list[Prompt], max_new: int) -> list[_Call]:
        """Different prompts, left-padded into one batch, an answer each."""
        encoded = [encode(prompt.messages, max_new, None)[0] for prompt in prompts]
        cache = build_cache(cfg["cache"], strict=False)
        samplings = [sampling(prompt.id) for prompt in prompts]
        results = generate_batch(model, encoded, cache, max_new, stop_ids, samplings, pad_token_id(tokenizer))
        width, kv_bytes = max(map(len, encoded)), cache.kv_bytes() // len(results)
        return [
            _Call(ids, None, cache, r, text(r), kv_bytes, row=row, padding=width - len(ids))
            for row, (ids, r) in enumerate(zip(encoded, results, strict=True))
        ]

    def text(result: Generation) -> str:
        return tokenizer.decode(result.tokens, skip_special_tokens=True)

    # prompts batch only when each has one answer and none is split for query-agnostic compression
    batch_size = generation_cfg["batch_size"] if task.query_start is None else 1
    batched = generation_cfg["num_samples"] == 1 and batch_size > 1
    if batched:
        groups = [todo[start : start + batch_size] for start in range(0, len(todo), batch_size)]
    else:
        groups = draw_groups(todo, generation_cfg["draw_batch"])
    progress = tqdm(
        total=len(todo), desc=f"{task.name} [{cfg['cache']['method']}]", disable=not cfg.get("progress", True)
    )
    for group in groups:
        if batched:
            firsts = call_batch(group, max_new_tokens)
        else:
            firsts = call(group[0].messages, max_new_tokens, [prompt.id for prompt in group])
        for prompt, first in zip(group, firsts, strict=True):
            calls = [first]
            if task.answer_pass:
                answer_messages = task.answer_pass.messages(prompt, first.output)
                calls += call(answer_messages, task.answer_pass.max_new_tokens, [f"{prompt.id}#answer"])
            _store(db, run_id, digest, task, prompt, calls, reference, tokenizer, model.device, len(group))
            progress.update()
    progress.close()


def _store(
    db: ResultsDB,
    run_id: int,
    digest: str,
    task: EvalTask,
    prompt: Prompt,
    calls: list[_Call],
    reference: Mapping[str, str],
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
    batch: int,
) -> None:
    """Score a prompt's final output and commit the sample with its calls' measurements."""
    first, output = calls[0], calls[-1].output
    metrics = task.score(prompt, output)
    extra = {**prompt.metadata, "compressed_prompt_tokens": first.compress_at or len(first.prompt_ids)}
    if batch > 1:
        extra["decoded_together"] = batch
    if first.cache.method != "full":
        extra["kept_histogram"] = first.cache.kept_histogram(
            len(first.prompt_ids), row=first.row, padding=first.padding
        )
    if task.answer_pass:
        extra["reasoning"] = first.output
        extra["calls"] = [_call_record(c) for c in calls]
    if prompt.id in reference:
        extra["fidelity"] = fidelity(tokenizer, output, reference[prompt.id])
    db.add_sample(
        run_id,
        digest,
        {
            "sample_id": prompt.id,
            "prompt_tokens": len(first.prompt_ids),
            "output": output,
            "target": prompt.target,
            "score": metrics["score"],
            "metrics": metrics,
            "prefill_s": sum(c.result.prefill_s for c in calls),
            "decode_s": sum(c.result.decode_s for c in calls),
            "generated_tokens": sum(len(c.result.tokens) for c in calls),
            "peak_memory_bytes": _peak_memory_bytes(device),
            "kv_bytes": max(c.kv_bytes for c in calls),
            "extra": extra,
        },
    )


def _call_record(made: _Call) -> dict[str, Any]:
    return {
        "prompt_tokens": len(made.prompt_ids),
        "generated_tokens": len(made.result.tokens),
        "prefill_s": made.result.prefill_s,
        "decode_s": made.result.decode_s,
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
