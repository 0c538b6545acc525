"""Registers the config schemas in Hydra's ConfigStore, where the files of ``conf/`` find them: the root
(``conf/config.yaml`` extends ``config_schema``), each kind of task (``conf/task/*.yaml`` extend
``<kind>_schema``), the models (``model_schema``) and one node per cache method (``cache=<method>``); and
the resolver of ``snapeval run --help``'s list of groups (:mod:`snapeval.configs.help`)."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from snapeval.configs.help import SCHEMA_SUFFIX, register_help
from snapeval.configs.methods import register_caches
from snapeval.configs.model import ModelConfig
from snapeval.configs.root import Config
from snapeval.configs.task import SCHEMAS


def register() -> None:
    """Store every schema (idempotent: a second call stores the same nodes again)."""
    store = ConfigStore.instance()
    store.store(name=f"config{SCHEMA_SUFFIX}", node=Config)
    for kind, schema in SCHEMAS.items():
        store.store(group="task", name=f"{kind}{SCHEMA_SUFFIX}", node=schema)
    store.store(group="model", name=f"model{SCHEMA_SUFFIX}", node=ModelConfig)
    register_caches(store)
    register_help()


register()  # at import: hydra.main (and a launcher's workers) compose before any call of ours
