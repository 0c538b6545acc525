"""Execute a checked run plan (:mod:`snapeval.plan`): model + cache (or a grid of caches) + task, every
sample not yet stored generated, scored, recorded, and summarized.

The runner knows no compression method (the batcher builds caches with :func:`snapeval.cache.build_cache`)
and no task (the plan holds it). Each scored sample is committed to the results database as soon as it is
done, so an interrupted run resumes where it stopped. A grid (:mod:`snapeval.grid`) is stored as one run
per cache setting, exactly as those settings run one at a time would be.
"""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm import tqdm

from snapeval import protocols
from snapeval.batch_rows import usable_rows
from snapeval.cache import effective_params, install
from snapeval.continuous import Answer, ContinuousBatcher, Request
from snapeval.errors import SnapevalError
from snapeval.grid import shares_prefill
from snapeval.models import ModelSpec, attach_drafts, load_model, load_tokenizer
from snapeval.plan import RunPlan, make_plan
from snapeval.records import answer_text, sample_row
from snapeval.requests import RequestBuilder, sample_seed, sampling, stop_ids
from snapeval.results import DEFAULT_LEASE_S, ResultsDB, config_hash, stored_config, summary_of
from snapeval.results.leases import Lease
from snapeval.tasks import Prompt, Task
from snapeval.workers import ClaimingFeed, shard, stored_in, terminate_as_interrupt


@dataclass(frozen=True)
class RunSummary:
    """One cache setting's run: its samples' accuracy, memory and speed, and how many were new."""

    run_id: int
    config_hash: str
    config: dict[str, Any]
    n: int
    accuracy: float
    ci_low: float
    ci_high: float
    kv_mib: float
    prefill_s: float
    decode_tok_s: float
    computed: int
    elsewhere: int  # samples this run left to other workers on the same point (they held its claims)
    pass_at: dict[str, float]  # pass@k for the k that the draws per problem allow (stats.pass_at)


def draws(prompts: list[Prompt], num_samples: int) -> list[Prompt]:
    """Each prompt ``num_samples`` times (ids ``<id>#<k>``) for pass@1 over n sampled answers."""
    if num_samples == 1:
        return prompts
    return [
        replace(prompt, id=f"{prompt.id}#{k}", metadata={**prompt.metadata, "problem": prompt.id, "draw": k})
        for prompt in prompts
        for k in range(num_samples)
    ]


def run(cfg: dict[str, Any]) -> list[RunSummary]:
    """Check ``cfg`` into a plan (:func:`snapeval.plan.make_plan`; a config that fails is recorded as a
    failed run, so that a sweep's summary shows the point) and :func:`execute` it."""
    try:
        plan = make_plan(cfg)
    except SnapevalError as exc:
        with contextlib.suppress(SnapevalError), ResultsDB(cfg["run"]["db"]) as db:
            _record_failure(db, cfg, exc)
        raise
    return execute(plan)


def execute(plan: RunPlan) -> list[RunSummary]:
    """Evaluate the plan's model and task with each of its cache settings; store every sample; return one
    summary per setting. A setting the plan set aside (impossible parameters) is recorded as failed and
    skipped, its error printed. Nothing is checked again."""
    cfg, task = plan.config, plan.task
    protocols.announce(cfg)  # a preset's deviations from the official run, stored with it (its config)
    with ResultsDB(cfg["run"]["db"]) as db:
        for setting, exc in plan.failed:  # recorded, so that a sweep's summary shows the failed point
            _record_failure(db, setting, exc)
            print(f"error: {exc} (this grid point is skipped)", file=sys.stderr)
        spec = ModelSpec.from_config(cfg["model"])
        prompts = draws(task.prompts(load_tokenizer(spec)), cfg["generation"]["num_samples"])
        prompts = shard(prompts, cfg["run"]["shard"])
        lease_s = cfg["run"].get("lease_s", DEFAULT_LEASE_S)
        points = _start_points(db, list(plan.points), prompts, lease_s)
        run_ids = [point.run_id for point in points]
        try:
            with terminate_as_interrupt(), Lease(lambda: db.renew(run_ids, lease_s), lease_s):
                if any(point.todo for point in points):
                    _evaluate(cfg, spec, task, prompts, points, db, lease_s)
        except KeyboardInterrupt:
            for point in points:
                db.finish_run(point.run_id, "interrupted")
            raise
        except Exception as exc:
            for point in points:
                db.finish_run(point.run_id, "failed", f"{type(exc).__name__}: {exc}")
            raise
        wanted = {prompt.id for prompt in prompts}
        summaries = []
        for point in points:
            db.finish_run(point.run_id, "finished")
            rows = [row for row in db.samples_for(point.digest) if row["sample_id"] in wanted]
            summaries.append(_summarize(point, rows))
    return summaries


@dataclass
class _Point:
    """One cache setting of a run: its stored config, hash and run, the samples it lacked at the start,
    those this worker claimed (the others' claims it leaves alone) and how many it stored."""

    config: dict[str, Any]
    digest: str
    run_id: int
    todo: set[str]
    claimed: set[str] = field(default_factory=set)
    stored: int = 0


def _record_failure(db: ResultsDB, cfg: Mapping[str, Any], exc: SnapevalError) -> None:
    stored = stored_config(cfg, cfg["cache"])  # the cache as given: it could not be built
    db.finish_run(db.start_run(stored, config_hash(stored)), "failed", str(exc))


def _start_points(
    db: ResultsDB, configs: list[dict[str, Any]], prompts: list[Prompt], lease_s: float
) -> list[_Point]:
    """A started run per distinct config, the full cache's first (its outputs are the others' reference)."""
    points: dict[str, _Point] = {}
    for config in sorted(configs, key=lambda config: config["cache"]["method"] != "full"):
        digest = config_hash(config)
        if digest not in points:
            done = db.done_sample_ids(digest)
            todo = {prompt.id for prompt in prompts if prompt.id not in done}
            points[digest] = _Point(config, digest, db.start_run(config, digest, lease_s), todo)
    return list(points.values())


def _full_cache_digest(config: Mapping[str, Any]) -> str:
    """The config hash of the full-cache run of the same model, task and samples as ``config``."""
    return config_hash({**config, "cache": effective_params({"method": "full"})})


def _evaluate(
    cfg: Mapping[str, Any],
    spec: ModelSpec,
    task: Task,
    prompts: list[Prompt],
    points: list[_Point],
    db: ResultsDB,
    lease_s: float,
) -> None:
    """Generate, score and store every missing (prompt, point) through the continuous batcher; a
    two-pass task's answer call is queued as soon as its first call ends.

    Requests go prompt by prompt, so all points and draws of a prompt share one prefill (one per point
    when ``grid.share_prefill`` is false: then each point runs alone). Each sample is committed the
    moment its last call ends, except that a compressed point's sample waits for the full cache's
    output of the same sample when that is being computed in this run (its fidelity needs it).
    """
    model = install(load_model(spec))
    tokenizer = load_tokenizer(spec)
    attach_drafts(model, tokenizer, [point.config["cache"] for point in points])
    eos = model.generation_config.eos_token_id
    builder = RequestBuilder.for_task(
        tokenizer, task, spec.max_context, stop_ids(tokenizer.eos_token_id, eos)
    )
    stops = getattr(task, "stop", ())  # the task's stop strings

    def request(point: _Point, prompt: Prompt, messages, max_new: int, calls: list[Answer]) -> Request:
        # the draws and points of one problem share one encoding (and, in the batcher, one prefill)
        seed = sample_seed(cfg["seed"], f"{prompt.id}#answer" if calls else prompt.id)
        draw = sampling(cfg["generation"], seed)
        return builder.request(messages, max_new, point.config["cache"], draw, stops, (point, prompt, calls))

    full_digest = _full_cache_digest(points[0].config)
    reference = {row["sample_id"]: row["output"] for row in db.samples_for(full_digest)}
    full = next((point for point in points if point.digest == full_digest), None)
    awaiting: dict[str, list[tuple[_Point, Prompt, list[Answer]]]] = defaultdict(list)
    label = points[0].config["cache"]["method"] if len(points) == 1 else f"{len(points)} cache settings"
    progress = tqdm(
        total=sum(len(point.todo) for point in points),
        desc=f"{task.name} [{label}]",
        disable=not cfg["run"]["progress"],
    )

    def store(point: _Point, prompt: Prompt, calls: list[Answer]) -> None:
        if (
            point is not full
            and full is not None
            and prompt.id in full.claimed
            and prompt.id not in reference
        ):
            awaiting[prompt.id].append((point, prompt, calls))
            return
        known = None if point is full else reference.get(prompt.id)
        row = sample_row(task, prompt, calls, known, tokenizer, model.device)
        _store(db, point, row)
        progress.update()
        if point is full:
            reference[prompt.id] = row["output"]
            for waiting in awaiting.pop(prompt.id, []):
                store(*waiting)

    def on_answer(answer: Answer) -> list[Request]:
        point, prompt, calls = answer.request.tag
        calls = [*calls, answer]
        if task.answer_pass and len(calls) == 1:
            messages = task.answer_pass.messages(prompt, answer_text(tokenizer, answer))
            return [request(point, prompt, messages, task.answer_pass.max_new_tokens, calls)]
        store(point, prompt, calls)
        return []

    groups = [points] if shares_prefill(cfg) else [[point] for point in points]
    most = max(sum(prompt.id in point.todo for prompt in prompts for point in group) for group in groups)
    batch_size = usable_rows(cfg["run"]["batch_size"], most)  # rows beyond the requests stay idle
    batcher = ContinuousBatcher(model, batch_size, cfg["run"]["compile"])
    with progress:  # closed before an error is reported, so its line comes last
        for group in groups:
            queued = [
                request(point, prompt, prompt.messages, task.max_new_tokens, [])
                for prompt in prompts
                for point in group
                if prompt.id in point.todo
            ]
            if not queued:
                continue
            batcher.reserve(queued)  # for all of them: claiming as it goes never resizes the compiled step
            while queued:
                feed = ClaimingFeed(db, queued, batch_size, lease_s)
                batcher.run([], on_answer, more=feed.next)
                if not feed.claimed_any:
                    break  # the rest is claimed by live workers: theirs to store
                done = {point.digest: db.done_sample_ids(point.digest) for point in group}
                queued = [queued_request for queued_request in queued if not stored_in(queued_request, done)]


def _store(db: ResultsDB, point: _Point, row: dict[str, Any]) -> None:
    """Commit one scored sample to its point's run."""
    point.stored += db.add_sample(point.run_id, point.digest, row)


def _summarize(point: _Point, rows: list[dict[str, Any]]) -> RunSummary:
    if not rows and not point.todo:
        raise SnapevalError("no samples were evaluated", "run.limit")
    summary = summary_of(rows)
    return RunSummary(
        run_id=point.run_id,
        config_hash=point.digest,
        config=point.config,
        n=summary["n"],
        accuracy=summary["accuracy"],
        ci_low=summary["ci_low"],
        ci_high=summary["ci_high"],
        kv_mib=summary["kv_mib"],
        prefill_s=summary["prefill_s"],
        decode_tok_s=summary["decode_tok_s"],
        computed=point.stored,
        elsewhere=len(point.todo - point.claimed),
        pass_at={key: value for key, value in summary.items() if key.startswith("pass@")},
    )
