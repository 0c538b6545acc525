"""Execute a checked run plan (:mod:`snapeval.run.plan`): model + cache (or a grid of caches) + task, every
sample not yet stored generated, scored, recorded, and summarized.

The runner knows no compression method (the batcher builds caches with :func:`snapeval.cache.build_cache`)
and no task (the plan holds it). Each scored sample is committed to the results database as soon as it is
done, so an interrupted run resumes where it stopped. A grid (:mod:`snapeval.configs.grid`) is stored as
one run per cache setting, exactly as those settings run one at a time would be; its runs start, and close, in
one transaction. Ctrl-C or SIGTERM closes them as interrupted, and so does a write that fails (the disk
full): one line naming ``run.db``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from sqlalchemy.exc import DBAPIError

from snapeval.cli.world import launcher_world
from snapeval.errors import SnapevalError
from snapeval.models import ModelSpec, check_chat
from snapeval.models.parallel import init_process_group
from snapeval.results import DEFAULT_LEASE_S, ResultsDB, config_hash, stored_config, summary_of
from snapeval.results.connect import write_error
from snapeval.results.leases import Lease
from snapeval.results.mirror import open_results
from snapeval.run.evaluation import Evaluation, Loaded
from snapeval.run.plan import PlannedPoint, RunPlan, make_plan
from snapeval.run.points import Point
from snapeval.run.signals import stop_on_signals
from snapeval.run.workers import shard
from snapeval.tasks import Prompt


@dataclass(frozen=True)
class RunSummary:
    """One cache setting's run: its samples' accuracy, memory and speed (named as the keys of
    :func:`~snapeval.results.summary_of`), and how many were new."""

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


def run(
    cfg: dict[str, Any], loaded: Loaded | None = None, models: dict[ModelSpec, Loaded] | None = None
) -> list[RunSummary]:
    """Check ``cfg`` into a plan (:func:`snapeval.run.plan.make_plan`; a config that fails is recorded as a
    failed run, so that a sweep's summary shows the point) and :func:`execute` it (on ``loaded``: a model
    already loaded for the same ``cfg["model"]``; or the one of ``models``, the models a sweep's jobs
    share by spec, loading it there if it is not yet)."""
    try:
        plan = make_plan(cfg)
    except SnapevalError as exc:
        with contextlib.suppress(SnapevalError, DBAPIError), results_db(cfg) as db:
            _record_failures(db, [(cfg, exc)])
        raise
    if loaded is None and models is not None:
        spec = ModelSpec.from_config(plan.config["model"])
        loaded = models.setdefault(spec, Loaded(spec))
    return execute(plan, loaded)


def execute(plan: RunPlan, loaded: Loaded | None = None) -> list[RunSummary]:
    """Evaluate the plan's model and task with each of its cache settings; store every sample; return one
    summary per setting. A setting the plan set aside (impossible parameters) is recorded as failed and
    skipped, its error printed. Nothing is checked again. A write to the database that fails is a
    :class:`SnapevalError` on ``run.db`` (its runs closed as interrupted where the database lets them)."""
    cfg = plan.config
    with results_db(cfg) as db:
        try:
            return _execute(plan, db, loaded or Loaded(ModelSpec.from_config(cfg["model"])))
        except DBAPIError as exc:
            raise write_error(exc, db.url) from None


def results_db(cfg: Mapping[str, Any]) -> ResultsDB:
    """The run's database: under torchrun opened by rank 0 alone, its answers broadcast to the other
    ranks (:mod:`snapeval.results.mirror`), its runs recording the ranks the model is split across."""
    world = launcher_world()
    if world.parallel:
        init_process_group(
            world, cfg["run"]["rendezvous_s"]
        )  # the database's answers travel over it, before the model loads
    return open_results(cfg["run"]["db"], world.size, world.rank)


def _execute(plan: RunPlan, db: ResultsDB, loaded: Loaded) -> list[RunSummary]:
    cfg, task = plan.config, plan.task
    _record_failures(db, plan.failed)  # recorded, so that a sweep's summary shows the failed points
    for _, exc in plan.failed:
        print(f"error: {exc} (this grid point is skipped)", file=sys.stderr)
    tokenizer = loaded.tokenizer
    check_chat(tokenizer, cfg["model"])
    prompts = draws(task.prompts(tokenizer), cfg["generation"]["num_samples"])
    prompts = shard(prompts, cfg["run"]["shard"])
    lease_s = cfg["run"].get("lease_s", DEFAULT_LEASE_S)
    tensor_parallel = launcher_world().parallel
    with stop_on_signals(tensor_parallel) as stops:  # from the runs' start: SIGTERM closes every one
        run_ids: list[int] = []
        try:
            points = _start_points(db, list(plan.points), prompts, lease_s)
            run_ids += [point.run_id for point in points]
            with Lease(lambda: db.renew(run_ids, lease_s), lease_s):
                if any(point.todo for point in points):
                    between_steps = stops.check if tensor_parallel else None
                    Evaluation(cfg, loaded, task, points, db).run(prompts, lease_s, between_steps)
            db.finish_runs(run_ids, "finished")
        except KeyboardInterrupt:
            _close(db, run_ids, "interrupted")
            raise
        except DBAPIError as exc:
            failure = write_error(exc, db.url)
            _close(db, run_ids, "interrupted", str(failure))
            raise failure from None
        except Exception as exc:
            _close(db, run_ids, "failed", f"{type(exc).__name__}: {exc}")
            raise
        wanted = {prompt.id for prompt in prompts}
        return [
            _summarize(point, [row for row in db.samples_for(point.digest) if row["sample_id"] in wanted])
            for point in points
        ]


def _close(db: ResultsDB, run_ids: list[int], status: str, error: str | None = None) -> None:
    """Close the runs after an error if the database lets them: a second try after its connections
    close (SQLite then folds its write-ahead log back into the file, which can free a full disk). Where
    it does not, their worker's exit shows them stale and their claims return to the next worker
    (:mod:`snapeval.results.leases`)."""
    try:
        db.finish_runs(run_ids, status, error)
    except DBAPIError:
        db.engine.dispose()
        with contextlib.suppress(DBAPIError):
            db.finish_runs(run_ids, status, error)


def _record_failures(db: ResultsDB, failed: Sequence[tuple[Mapping[str, Any], SnapevalError]]) -> None:
    """Record each config that could not run as a failed run, with its error, in one transaction."""
    entries = []
    for cfg, exc in failed:
        stored = stored_config(cfg, cfg["cache"])  # the cache as given: it could not be built
        entries.append((stored, config_hash(stored), str(exc)))
    if entries:
        db.record_failures(entries)


def _start_points(
    db: ResultsDB, planned: list[PlannedPoint], prompts: list[Prompt], lease_s: float
) -> list[Point]:
    """A started run per distinct config, the full cache's first (its outputs are the others' reference):
    one query for what is stored, one transaction for the runs."""
    distinct: dict[str, PlannedPoint] = {}
    for point in sorted(planned, key=lambda point: not point.setting.is_full):
        distinct.setdefault(config_hash(point.config), point)
    done = db.done_by_hash(distinct)
    run_ids = db.start_runs([(point.config, digest) for digest, point in distinct.items()], lease_s)
    return [
        Point(
            point.config,
            point.setting,
            digest,
            run_id,
            {prompt.id for prompt in prompts if prompt.id not in done[digest]},
        )
        for (digest, point), run_id in zip(distinct.items(), run_ids, strict=True)
    ]


def _summarize(point: Point, rows: list[dict[str, Any]]) -> RunSummary:
    if not rows and not point.todo:
        raise SnapevalError("no samples were evaluated", "run.limit")
    summary = summary_of(rows)
    numbers = {item.name: summary[item.name] for item in fields(RunSummary) if item.name in summary}
    return RunSummary(
        run_id=point.run_id,
        config_hash=point.digest,
        config=point.config,
        **numbers,
        computed=point.stored,
        elsewhere=len(point.todo - point.claimed),
        pass_at={key: value for key, value in summary.items() if key.startswith("pass@")},
    )
