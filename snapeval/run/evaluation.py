"""Generating, scoring and storing a run's missing samples: the steps of one execution of a plan.

:class:`Evaluation` loads the model, then, group by group (every setting of a grid together, or each
alone when ``grid.share_prefill`` is false or a deployed engine answers, each setting then with its own
server where ``engine.serve`` starts one: :mod:`snapeval.backends.serve`), queues a request per
(prompt, point) still to do, claims them in the database as the batcher frees rows
(:class:`snapeval.run.workers.ClaimingFeed`), queues a two-pass task's answer call as soon as its first
call ends, and scores and commits each sample the moment its last call ends (a compressed point's sample
waits for the full cache's output of the same sample when that is being computed too: its fidelity
needs it). A sample of several turns is one request: its first call carries the follow-up questions,
answered in turn on the same cache (snapeval's engine only).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from snapeval.backends import TRUNCATED, Answerer
from snapeval.backends.identity import engine_identity
from snapeval.backends.lm_eval import LmEvalAnswerer, make_client
from snapeval.backends.serve import log_path, served
from snapeval.cache import install
from snapeval.cli.world import writing_rank
from snapeval.configs.backend import lm_eval_model
from snapeval.configs.cache import FULL
from snapeval.configs.grid import shares_prefill
from snapeval.configs.setting import CacheSetting
from snapeval.decode.batch_rows import usable_rows
from snapeval.decode.continuous import Answer, ContinuousBatcher, Request
from snapeval.decode.stops import stop_ids
from snapeval.errors import SnapevalError
from snapeval.models import ModelSpec, attach_drafts, load_model, load_tokenizer, model_config
from snapeval.models.weights import weights_path
from snapeval.results import ResultsDB, config_hash
from snapeval.run.points import Point, SampleCall
from snapeval.run.records import answer_text, sample_row
from snapeval.run.requests import RequestBuilder, sample_seed, sampling
from snapeval.run.workers import ClaimingFeed, stored_in
from snapeval.tasks import Prompt, Task

Calls = tuple[Answer, ...]  # the answers of a sample's calls so far (two for a two-pass task)


def note(text: str, field: str) -> None:
    """A note to the user, on one line of stderr, naming the field it is about."""
    print(f"note: {field}: {text}", file=sys.stderr, flush=True)


def full_cache_digest(config: Mapping[str, Any]) -> str:
    """The config hash of the full-cache run of the same model, task and samples as ``config``."""
    return config_hash({**config, "cache": CacheSetting.of({"method": FULL}).stored})


def by_kv_dtype(groups: list[list[Point]]) -> dict[str | None, list[list[Point]]]:
    """``groups`` split by their points' ``cache.kv_dtype``, the model's dtype first (its full cache is
    the others' reference)."""
    split: dict[str | None, list[list[Point]]] = defaultdict(list)
    for group in groups:
        parts: dict[str | None, list[Point]] = defaultdict(list)
        for point in group:
            parts[point.setting.kv_dtype].append(point)
        for kv_dtype, part in parts.items():
            split[kv_dtype].append(part)
    return dict(sorted(split.items(), key=lambda item: item[0] is not None))


@dataclass
class Loaded:
    """A model's tokenizer and weights (the snapeval attention installed), each loaded at first use and then
    kept: one execution's, or those a command shares between the plans it runs on one model (a budget
    search's rounds load the model once)."""

    spec: ModelSpec

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return load_tokenizer(self.spec)

    @cached_property
    def model(self) -> PreTrainedModel:
        return install(load_model(self.spec))


class Evaluation:
    """One execution's generation: the model, the request builder, the full cache's outputs (the others'
    reference) and the samples waiting for them, and the progress bar."""

    def __init__(
        self,
        cfg: Mapping[str, Any],
        loaded: Loaded,
        task: Task,
        points: list[Point],
        db: ResultsDB,
    ) -> None:
        self.cfg, self.task, self.points, self.db = cfg, task, points, db
        self.writes = writing_rank()  # under torchrun rank 0 alone scores (a sandbox run, once) and stores
        self.tokenizer = tokenizer = loaded.tokenizer
        self.remote = lm_eval_model(cfg["model"].get("backend"))  # a deployed engine's lm-eval client
        self.model = None if self.remote else loaded.model
        if self.model is not None:
            attach_drafts(self.model, tokenizer, [point.config["cache"] for point in points])
            weights = weights_path(self.model, model_config(loaded.spec))  # fp8 kernels, dequantized, ...
            db.record_engine([point.run_id for point in points], {"backend": "snapeval", "weights": weights})
        self.device = torch.device("cpu") if self.model is None else self.model.device
        eos = stop_ids(tokenizer, None if self.model is None else self.model.generation_config)
        self.builder = RequestBuilder.for_task(tokenizer, task, loaded.spec.max_context, eos)
        digest = full_cache_digest(points[0].config)
        self.reference = {row["sample_id"]: row["output"] for row in db.samples_for(digest)}
        self.full = next((point for point in points if point.digest == digest), None)
        self.awaiting: dict[str, list[tuple[Point, Prompt, Calls]]] = defaultdict(list)
        self.ports: set[int] = set()  # of the servers engine.serve started: a point never reuses one
        label = points[0].config["cache"]["method"] if len(points) == 1 else f"{len(points)} cache settings"
        self.progress = tqdm(
            total=sum(len(point.todo) for point in points),
            desc=f"{task.name} [{label}]",
            disable=not cfg["run"]["progress"] or not self.writes,  # one bar: rank 0's under torchrun
        )

    def run(
        self, prompts: list[Prompt], lease_s: float, between_steps: Callable[[], None] | None = None
    ) -> None:
        """Generate, score and store every missing (prompt, point), group by group (a deployed engine's
        settings one by one, each its own server); ``between_steps`` before each decode step
        (:meth:`snapeval.run.signals.Stops.check`)."""
        self.check_turns(prompts)
        together = shares_prefill(self.cfg) and self.remote is None
        groups = [self.points] if together else [[point] for point in self.points]
        with self.progress:  # closed before an error is reported, so its line comes last
            if self.remote is not None:
                for [point] in groups:
                    if any(prompt.id in point.todo for prompt in prompts):
                        with self.engine(point) as answerer:
                            self.run_group(answerer, [point], prompts, lease_s, between_steps)
                        if point.cut:
                            note(
                                f"the server cut {point.cut} of {point.stored} prompts without saying so (it "
                                f"counted fewer prompt tokens than were sent): stored as {TRUNCATED}",
                                "model.backend",
                            )
                return
            for kv_dtype, split in by_kv_dtype(groups).items():  # the rows of one batcher store one dtype
                most = max(sum(prompt.id in p.todo for prompt in prompts for p in group) for group in split)
                batcher = self.batcher(most, kv_dtype)
                for group in split:
                    self.run_group(batcher, group, prompts, lease_s, between_steps)

    def check_turns(self, prompts: list[Prompt]) -> None:
        """Refuse, before any call, a sample of several turns that only snapeval's engine answers: under a
        deployed engine (one turn a call), or in a two-pass task (its answer call is one turn)."""
        turns = max((prompt.turns for prompt in prompts), default=1)
        if turns == 1:
            return
        asks = f"task {self.task.name} asks {turns} questions of each context, one turn after another"
        if self.remote is not None:
            message = f"{asks}, which only snapeval's engine answers for now (model.backend=snapeval)"
            raise SnapevalError(message, "model.backend")
        if self.task.answer_pass:
            raise SnapevalError(f"{asks}: a two-pass task answers one", "task.answer_pass")

    def batcher(self, most: int, kv_dtype: str | None = None) -> Answerer:
        """snapeval's batcher, in as many rows as the requests need (at most ``most``), storing keys and
        values in ``kv_dtype`` (``cache.kv_dtype``)."""
        run = self.cfg["run"]
        rows = usable_rows(run["batch_size"], most)  # rows beyond the requests stay idle
        options = {"decode_attention": run["decode_attention"], "kv_dtype": kv_dtype}
        return ContinuousBatcher(self.model, rows, run["compile"], **options)

    @contextmanager
    def engine(self, point: Point) -> Iterator[Answerer]:
        """The deployed engine's lm-eval client for ``point``: its server started for it (``engine.serve``)
        and stopped after it, the engine's identity stored with its run."""
        log = log_path(self.db.url, point.digest, point.run_id)
        with served(self.cfg, point.config["cache"], log, self.ports) as engine:
            backend = str(self.cfg["model"]["backend"])
            log_name = None if engine.log is None else str(engine.log)
            identity = engine_identity(backend, engine.backend_args, engine.command, log_name, engine.models)
            self.db.record_engine([point.run_id], identity)
            if identity["note"]:
                note(identity["note"], "model.backend_args")
            client = make_client(self.remote, engine.backend_args)
            stops = getattr(self.task, "stop", ())
            yield LmEvalAnswerer(client, self.tokenizer, stops, self.cfg["run"]["batch_size"])

    def run_group(
        self,
        batcher: Answerer,
        group: list[Point],
        prompts: list[Prompt],
        lease_s: float,
        between_steps: Callable[[], None] | None,
    ) -> None:
        """The group's requests, claimed as rows free, until none is left or live workers hold the rest."""
        task = self.task
        queued = [
            self.request(point, prompt, prompt.messages, task.max_new_tokens, ())
            for prompt in prompts
            for point in group
            if prompt.id in point.todo
        ]
        if queued:
            batcher.reserve(queued)  # for all of them: claiming as it goes never resizes the compiled step
        while queued:
            feed = ClaimingFeed(self.db, queued, batcher.rows, lease_s)
            batcher.run([], self.on_answer, more=feed.next, between_steps=between_steps)
            if not feed.claimed_any:
                return  # the rest is claimed by live workers: theirs to store
            done = self.db.done_by_hash(point.digest for point in group)
            queued = [request for request in queued if not stored_in(request, done)]

    def request(self, point: Point, prompt: Prompt, messages: Any, max_new: int, calls: Calls) -> Request:
        """The request of a sample's next call (the draws and points of one problem share one encoding,
        and in the batcher one prefill)."""
        seed = sample_seed(self.cfg["seed"], f"{prompt.id}#answer" if calls else prompt.id)
        draw = sampling(self.cfg["generation"], seed)
        stops = getattr(self.task, "stop", ())  # the task's stop strings
        tag = SampleCall(point, prompt, calls)
        followups = () if calls else prompt.followups
        return self.builder.request(messages, max_new, point.setting, draw, stops, tag, followups)

    def on_answer(self, answer: Answer) -> list[Request]:
        """A call ended: queue a two-pass task's answer call, or store the sample."""
        tag: SampleCall = answer.request.tag
        point, prompt, calls = tag.point, tag.prompt, (*tag.calls, answer)
        answer_pass = self.task.answer_pass
        if answer_pass and len(calls) == 1:
            messages = answer_pass.messages(prompt, answer_text(self.tokenizer, answer))
            return [self.request(point, prompt, messages, answer_pass.max_new_tokens, calls)]
        self.store(point, prompt, calls)
        return []

    def store(self, point: Point, prompt: Prompt, calls: Calls) -> None:
        """Score and commit a sample (a compressed one after the full cache's output it is compared with)."""
        full, reference = self.full, self.reference
        if (
            point is not full
            and full is not None
            and prompt.id in full.claimed
            and prompt.id not in reference
        ):
            self.awaiting[prompt.id].append((point, prompt, calls))
            return
        known = None if point is full else reference.get(prompt.id)
        if self.writes:
            row = sample_row(self.task, prompt, calls, known, self.tokenizer, self.device)
        else:  # another rank of a tensor-parallel run: rank 0 scores and stores; the output orders the waits
            row = {"sample_id": prompt.id, "output": answer_text(self.tokenizer, calls[-1])}
        self.commit(point, row)
        if point is full:
            reference[prompt.id] = row["output"]
            for waiting in self.awaiting.pop(prompt.id, []):
                self.store(*waiting)

    def commit(self, point: Point, row: dict[str, Any]) -> None:
        """Commit one scored sample to its point's run."""
        added = self.db.add_sample(point.run_id, point.digest, row)
        point.stored += added
        point.cut += added and TRUNCATED in row.get("extra", {})
        self.progress.update()
