"""The report's view of a results database: every stored config (a cache setting) with its runs and
samples, grouped into experiments: a full-cache config and the compressed configs whose full-cache run
of the same model, task and samples it is (the pairing of
:func:`snapeval.run.evaluation.full_cache_digest`)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from snapeval.configs.cache import FULL
from snapeval.configs.methods import METHODS
from snapeval.configs.setting import effective_params
from snapeval.errors import SnapevalError
from snapeval.results import UNHASHED, ResultsDB, config_hash, flatten

#: Cache parameters that size a cache: a series of settings differs in these alone.
SIZES = ("budget", "ratio")


@dataclass(frozen=True)
class Setting:
    """One stored config: its hash, its config (the latest run's), its runs and its samples."""

    digest: str
    config: dict[str, Any]
    runs: tuple[dict[str, Any], ...]
    samples: tuple[dict[str, Any], ...]

    @property
    def cache(self) -> dict[str, Any]:
        return dict(self.config.get("cache") or {})

    @property
    def method(self) -> str:
        return str(self.cache.get("method"))

    @property
    def size(self) -> tuple[str, float] | None:
        """``("budget", 256)`` or ``("ratio", 0.25)``: what sizes the cache; None for the full cache."""
        return next(((key, self.cache[key]) for key in SIZES if self.cache.get(key) is not None), None)

    @property
    def size_label(self) -> str:
        if self.size is None:
            return "-"
        key, value = self.size
        return f"{value:g}" if key == "budget" else f"ratio {value:g}"

    def scores(self) -> dict[str, float]:
        """Score per sample id, for the samples that have one."""
        return {row["sample_id"]: row["score"] for row in self.samples if row["score"] is not None}

    @property
    def tensor_parallel(self) -> tuple[int, ...]:
        """The TP degrees (ranks the model was split across) of the runs that stored its samples, smallest
        first; of all its runs where none stored one. A run's ``tensor_parallel`` column, 1 where NULL (a
        run from before TP) or absent (a database older than the column)."""
        storing = {row.get("run_id") for row in self.samples}
        runs = [run for run in self.runs if run.get("id") in storing] or list(self.runs)
        return tuple(sorted({run_degree(run) for run in runs}))


@dataclass(frozen=True)
class Series:
    """The settings of one method that differ only in their size (budget or ratio), smallest first."""

    label: str
    method: str
    settings: tuple[Setting, ...]

    def labelled(self, setting: Setting) -> str:
        """The label of one of its settings: the series' and the setting's size."""
        return f"{self.label} {setting.size_label}" if setting.size else self.label


@dataclass(frozen=True)
class Experiment:
    """A full-cache config (``reference``, its setting if stored) and the compressed settings paired with
    it; ``distinct``: the config values that set it apart from the other experiments of its model and task."""

    reference: str
    model: str
    task: str
    full: Setting | None
    series: tuple[Series, ...]
    distinct: dict[str, Any]

    @property
    def title(self) -> str:
        extra = ", ".join(f"{key}={value}" for key, value in self.distinct.items())
        return f"{self.model} · {self.task}" + (f" ({extra})" if extra else "")

    @property
    def config(self) -> dict[str, Any]:
        """The full-cache config (the compressed settings' with the full cache, when none is stored)."""
        if self.full is not None:
            return self.full.config
        return full_cache_config(self.series[0].settings[0].config)

    def labelled(self) -> list[tuple[str, Setting]]:
        """Every setting with its label (``SnapKV 256``): the full cache (when stored), then each series."""
        full = [("Full cache", self.full)] if self.full else []
        return full + [(series.labelled(s), s) for series in self.series for s in series.settings]

    @property
    def tensor_parallel(self) -> tuple[int, ...]:
        """The TP degrees of the runs behind every setting's samples (:attr:`Setting.tensor_parallel`),
        smallest first: ``(1,)`` for a database from before TP."""
        return tuple(sorted({tp for _, setting in self.labelled() for tp in setting.tensor_parallel}))


def run_degree(run: Mapping[str, Any]) -> int:
    """A stored run's TP degree: its ``tensor_parallel``, 1 where NULL or not stored."""
    degree = run.get("tensor_parallel")
    return degree if isinstance(degree, int) and not isinstance(degree, bool) and degree > 0 else 1


def method_label(method: str) -> str:
    """A built-in method's label; any other method by its name (its class is never imported here)."""
    return METHODS[method].label if method in METHODS else method


def full_cache_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the full cache: the config of its full-cache run of the same samples."""
    return {**config, "cache": effective_params({"method": FULL})}


def load_experiments(db: ResultsDB) -> list[Experiment]:
    """Every experiment of ``db``, by model, task and title; a database without samples is an error."""
    runs_by_digest: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in db.runs_since(datetime(1970, 1, 1)):
        runs_by_digest[run["config_hash"]].append(run)
    settings = {
        digest: Setting(digest, dict(runs[-1]["config"]), tuple(runs), tuple(db.samples_for(digest)))
        for digest, runs in runs_by_digest.items()
    }
    if not any(setting.samples for setting in settings.values()):
        raise SnapevalError(f"{db.url} holds no scored samples: nothing to report", "--db")
    grouped: dict[str, list[Setting]] = defaultdict(list)
    for setting in settings.values():
        grouped[config_hash(full_cache_config(setting.config))].append(setting)
    experiments = [
        _experiment(reference, settings.get(reference), [s for s in members if s.digest != reference])
        for reference, members in grouped.items()
    ]
    experiments = _with_distinct(experiments)
    return sorted(experiments, key=lambda e: (e.model, e.task, json.dumps(e.distinct, default=str)))


def _experiment(reference: str, full: Setting | None, compressed: list[Setting]) -> Experiment:
    config = full.config if full else full_cache_config(compressed[0].config)
    by_series: dict[str, list[Setting]] = defaultdict(list)
    for setting in compressed:
        by_series[_series_key(setting)].append(setting)
    labels = _series_labels({key: members[0] for key, members in by_series.items()})
    series = tuple(
        Series(labels[key], members[0].method, tuple(sorted(members, key=_size_order)))
        for key, members in sorted(by_series.items(), key=lambda item: labels[item[0]])
    )
    model = str((config.get("model") or {}).get("name"))
    task = str((config.get("task") or {}).get("name"))
    return Experiment(reference, model, task, full, series, {})


def _series_key(setting: Setting) -> str:
    unsized = {key: value for key, value in setting.cache.items() if key not in SIZES}
    return json.dumps(unsized, sort_keys=True, default=str)


def _size_order(setting: Setting) -> tuple[str, float]:
    return setting.size or ("", 0.0)


def _series_labels(first: dict[str, Setting]) -> dict[str, str]:
    """A label per series: the method's, then the parameters that tell it from the method's other series."""
    labels = {}
    for key, setting in first.items():
        others = [s.cache for k, s in first.items() if k != key and s.method == setting.method]
        differing = sorted(
            name
            for name, value in setting.cache.items()
            if name not in SIZES and any(other.get(name) != value for other in others)
        )
        params = " ".join(f"{name}={setting.cache.get(name)}" for name in differing)
        labels[key] = method_label(setting.method) + (f" {params}" if params else "")
    return labels


def _with_distinct(experiments: list[Experiment]) -> list[Experiment]:
    """The experiments, each with the config values (cache and unhashed keys aside) that differ between
    the experiments of its model and task."""
    flat = {id(e): _identifying(e.config) for e in experiments}
    result = []
    for experiment in experiments:
        peers = [flat[id(e)] for e in experiments if (e.model, e.task) == (experiment.model, experiment.task)]
        keys = sorted({key for f in peers for key in f if any(p.get(key) != f.get(key) for p in peers)})
        distinct = {key: flat[id(experiment)].get(key, "-") for key in keys}
        result.append(replace(experiment, distinct=distinct))
    return result


def _identifying(config: Mapping[str, Any]) -> dict[str, Any]:
    def ignored(key: str) -> bool:
        return key.startswith("cache.") or any(key == k or key.startswith(f"{k}.") for k in UNHASHED)

    return {
        key: json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else value
        for key, value in flatten(config).items()
        if not ignored(key)
    }
