"""The ``model`` group: which weights, how they load, the model's window (``conf/model/*.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snapeval.configs.backend import backend_args_check, backend_check
from snapeval.configs.fields import (
    PROMPT_STYLES,
    Checked,
    boolean,
    choice,
    device,
    integer,
    model_name,
    optional_text,
    overrides_mapping,
    setting,
    text,
)

DTYPES = ("float32", "bfloat16", "float16")
"""The weights' dtypes a model loads in (besides ``auto``), named as torch names them."""


@dataclass
class ModelConfig(Checked):
    """A model: a ``conf/model`` entry, or other weights over it (``model.pretrained=<folder or Hub id>``)."""

    path = "model"

    name: str = setting(check=model_name, help="the name results are stored and shown under")
    pretrained: str = setting(check=text, help="a Hub id, a local folder, or pkg://<package> (embedded)")
    gguf_file: str | None = setting(None, check=optional_text, help="a GGUF file inside pretrained")
    hub_id: str | None = setting(
        None, check=optional_text, hashed=False, help="the config it was converted from (memory estimator)"
    )
    dtype: str = setting("auto", check=choice("auto", *DTYPES), help="auto: bfloat16 on CUDA, else float32")
    device: str = setting("auto", check=device)
    max_context: int = setting(8192, check=integer(low=16), help="the model's window, in tokens")
    tp_style: str = setting(
        "tp",
        check=choice("tp", "ep"),
        hashed=False,
        help="under torchrun: tp (the family's TP plan splits experts too) or ep (its expert-parallel plan "
        "gives each rank whole experts)",
    )
    prompt_style: str = setting(
        "openai_chat",
        check=choice(*PROMPT_STYLES),
        hashed=False,
        help="LiveCodeBench's prompt for this model (hashed as the task.prompt_style it sets)",
    )
    completion: bool = setting(
        False,
        check=boolean,
        when_set=True,
        help="a base model (no chat template): prompts are plain text; RULER tasks only",
    )
    allow_past_trained_positions: bool = setting(
        False,
        check=boolean,
        hashed=False,
        when_set=True,
        help="let a run pass the max_position_embeddings of the model's config (RoPE scaling); stored",
    )
    config_overrides: Any = setting(  # Any: OmegaConf cannot merge a mapping into a null Dict node
        None,
        check=overrides_mapping,
        when_set=True,
        help="attributes set on the model's Hugging Face config (YaRN rope_parameters)",
    )
    backend: str | None = setting(
        None,
        check=backend_check,
        when_set=True,
        help="who answers: null (snapeval's engine) or lm_eval:<model> (a deployed engine)",
    )
    backend_args: str | None = setting(
        None,
        check=backend_args_check,
        hashed=False,
        when_set=True,
        help="the lm-eval model's arguments, k=v,k=v (base_url=...,model=...); no secrets",
    )
