"""lm-eval's side of snapeval's tasks: every ``snapeval_<task>.yaml`` here delegates to the registry.

``load`` builds the task from its Hydra config (``conf/task/<task>.yaml``) with lm-eval's ``--metadata``
applied: keys of the task config (``context_length``, ``num_prompts``, ...) replace them, ``pretrained``
names the tokenizer of generated tasks, ``seed`` their seed, and any other key is a ``task.metadata``
option (``data_path``, ``answer_from``, ``code_extraction``, ``release``, ...). Each row carries that
config, so that the other functions rebuild the same task.
"""

import functools
import json

import datasets

from snapeval.configs.compose import compose_config
from snapeval.models import load_tokenizer, model_spec
from snapeval.tasks import Task, load_task

CONFIG_FIELD = "snapeval_task_config"


def load(task: str, pretrained: str = "smollm2-135m", seed: int = 0, **metadata) -> datasets.DatasetDict:
    config = compose_config(f"task={task}")["task"]
    for key, value in metadata.items():
        if key in config and key != "metadata":  # lm-eval may pass numbers as strings
            numeric = isinstance(config[key], int) and not isinstance(config[key], bool)
            config[key] = int(value) if numeric else value
        else:
            config.setdefault("metadata", {})[key] = value
    config_json = json.dumps({"config": config, "seed": int(seed)}, sort_keys=True)
    built = _task(config_json)
    tokenizer = load_tokenizer(model_spec(pretrained)) if built.needs_tokenizer else None
    rows = [{**row, CONFIG_FIELD: config_json} for row in built.rows(tokenizer)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    return _task(doc[CONFIG_FIELD]).user_text(doc)


def doc_to_target(doc: dict):
    return _task(doc[CONFIG_FIELD]).target(doc)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return _task(doc[CONFIG_FIELD]).score_row(doc, results[0])


@functools.lru_cache(maxsize=16)
def _task(config_json: str) -> Task:
    built = json.loads(config_json)
    return load_task(built["config"], built["seed"])
