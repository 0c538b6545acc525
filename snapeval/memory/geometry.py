"""Model geometry (layers, attention type, heads, parameters) from a transformers config.

A model is named by a built-in name (``snapeval/memory/models/<name>.json``, the relevant fields of
the official ``config.json``), a local ``config.json`` (or the directory holding it), or a Hugging
Face Hub id, which is fetched with ``transformers.AutoConfig``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snapeval.errors import SnapevalError
from snapeval.memory.config_fields import head_dim, optional_int, require_int
from snapeval.memory.parameters import estimate_parameters

if TYPE_CHECKING:
    from transformers import PretrainedConfig

MODELS_DIR = Path(__file__).with_name("models")
SLIDING_ATTENTION = "sliding_attention"


@dataclass(frozen=True)
class ModelGeometry:
    """What the KV-cache and weights arithmetic needs to know about a model."""

    name: str
    source: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    num_parameters: int
    parameters_estimated: bool
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    sliding_window: int | None = None
    num_sliding_layers: int = 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: the cache holds one compressed latent per token and layer."""
        return self.kv_lora_rank is not None

    @property
    def attention(self) -> str:
        """``mla``, ``mha``, ``mqa`` or ``gqa``."""
        if self.is_mla:
            return "mla"
        if self.num_kv_heads == self.num_attention_heads:
            return "mha"
        return "mqa" if self.num_kv_heads == 1 else "gqa"


def geometry_from_config(
    config: PretrainedConfig | Mapping[str, Any],
    *,
    name: str | None = None,
    source: str | None = None,
    num_parameters: int | None = None,
) -> ModelGeometry:
    """The geometry of a transformers config or its ``config.json`` dict.

    The parameter count is ``num_parameters`` if given (e.g. ``model.num_parameters()``), else the
    config's ``_num_parameters`` (built-ins), else estimated from the config.
    """
    fields = _config_dict(config)
    layers = require_int(fields, "num_hidden_layers")
    heads = require_int(fields, "num_attention_heads")
    kv_lora_rank = optional_int(fields, "kv_lora_rank")
    rope_dim = require_int(fields, "qk_rope_head_dim") if kv_lora_rank else None
    window, sliding_layers = sliding_window_layers(fields, layers)
    known_parameters = num_parameters or fields.get("_num_parameters")
    label = name or fields.get("_name_or_path") or fields.get("model_type") or "model"
    return ModelGeometry(
        name=label,
        source=source or fields.get("_source") or label,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=optional_int(fields, "num_key_value_heads") or heads,
        head_dim=head_dim(fields),
        num_parameters=known_parameters or estimate_parameters(fields),
        parameters_estimated=not known_parameters,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim,
        sliding_window=window,
        num_sliding_layers=sliding_layers,
    )


def sliding_window_layers(config: Mapping[str, Any], num_layers: int) -> tuple[int | None, int]:
    """The sliding window and how many layers use it; ``(None, 0)`` when no layer does.

    Which layers slide: ``layer_types`` when the config lists them; else, with ``use_sliding_window``
    (Qwen2), the layers from ``max_window_layers`` on; else, with ``sliding_window_pattern`` (Gemma 3),
    all but every pattern-th layer; else every layer (Mistral).
    """
    window = optional_int(config, "sliding_window")
    if window is None:
        return None, 0
    if config.get("layer_types") is not None:
        layer_types = config["layer_types"]
        if len(layer_types) != num_layers:
            raise SnapevalError(f"has {len(layer_types)} entries for {num_layers} layers", "layer_types")
        count = sum(kind == SLIDING_ATTENTION for kind in layer_types)
    elif "use_sliding_window" in config:
        full_layers = min(optional_int(config, "max_window_layers") or 0, num_layers)
        count = num_layers - full_layers if config["use_sliding_window"] else 0
    elif pattern := optional_int(config, "sliding_window_pattern"):
        count = num_layers - num_layers // pattern
    else:
        count = num_layers
    return (window, count) if count else (None, 0)


@functools.cache
def builtin_models() -> dict[str, Path]:
    """Built-in model names and aliases, each with its JSON file."""
    models = {}
    for path in sorted(MODELS_DIR.glob("*.json")):
        for name in (path.stem, *_read_json(path).get("_aliases", ())):
            models[name] = path
    return models


def load_geometry(name_or_path: str) -> ModelGeometry:
    """The geometry of a built-in model, a local ``config.json`` (or its directory), or a Hub id."""
    builtins = builtin_models()
    if name_or_path in builtins:
        return geometry_from_config(_read_json(builtins[name_or_path]), name=name_or_path)
    path = Path(name_or_path).expanduser()
    config_file = path / "config.json" if path.is_dir() else path
    if config_file.is_file():
        return geometry_from_config(_read_json(config_file), name=name_or_path, source=str(config_file))
    if path.exists() or path.suffix == ".json" or name_or_path.startswith((".", "/", "~")):
        raise SnapevalError(f"no config.json at {name_or_path!r}", "model")
    if "/" in name_or_path:
        return _load_from_hub(name_or_path)
    raise SnapevalError(
        f"unknown model {name_or_path!r}; choose one of {', '.join(builtins)}, "
        "or pass a local config.json path or a Hugging Face Hub id",
        "model",
    )


def _config_dict(config: PretrainedConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a config dict or a transformers config (of its text model, if multimodal)."""
    if isinstance(config, Mapping):
        text_config = config.get("text_config")
        nested = isinstance(text_config, Mapping) and "num_hidden_layers" not in config
        return dict(text_config if nested else config)
    text_config = config.get_text_config()
    fields = text_config.to_dict()
    fields.update({key: getattr(text_config, key) for key in text_config.attribute_map})
    return fields


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SnapevalError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno})", "model") from exc
    if not isinstance(data, dict):
        raise SnapevalError(f"{path} does not hold a JSON object", "model")
    return data


def _load_from_hub(repo_id: str) -> ModelGeometry:
    from huggingface_hub.errors import LocalEntryNotFoundError
    from transformers import AutoConfig

    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)  # no retry warnings: the failure is reported once, below
    try:
        config = AutoConfig.from_pretrained(repo_id)
    except (OSError, ValueError) as exc:
        choices = f"pass a local config.json path or a built-in name ({', '.join(builtin_models())})"
        if _caused_by(exc, LocalEntryNotFoundError):
            reason = f"the Hugging Face Hub is unreachable and {repo_id!r} is not in the local cache"
        else:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            reason = f"could not load the config of {repo_id!r} from the Hugging Face Hub ({detail})"
        raise SnapevalError(f"{reason}; {choices}", "model") from exc
    finally:
        hub_logger.setLevel(level)
    return geometry_from_config(config, name=repo_id, source=repo_id)


def _caused_by(exc: BaseException | None, kind: type[BaseException]) -> bool:
    while exc is not None:
        if isinstance(exc, kind):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
