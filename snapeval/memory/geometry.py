"""Model geometry (layers, attention type, heads, parameters) from a transformers config.

A model is named by a ``conf/model`` name (:mod:`snapeval.memory.catalogue`), a local ``config.json``
(or the directory holding it), or a Hugging Face Hub id: read offline when snapeval ships its config,
else fetched with ``transformers.AutoConfig``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snapeval.errors import SnapevalError
from snapeval.memory.catalogue import known_names, model_aliases, model_source, read_json, shipped_config
from snapeval.memory.config_fields import head_dim, kv_heads, layer_kinds, optional_int, require_int
from snapeval.memory.parameters import estimate_parameters
from snapeval.memory.sharding import whole_on_every_rank

if TYPE_CHECKING:
    from transformers import PretrainedConfig

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
    max_positions: int | None = None  # max_position_embeddings, where the config says
    checkpoint_dtype: str | None = None
    """The dtype its checkpoint stores weights in where the config says (``fp8``: a ``quantization_config``
    of ``quant_method: fp8``, as DeepSeek-V3/R1's release); None: not said (the estimate takes bf16)."""
    replicated: tuple[tuple[str, int], ...] | None = None
    """The parts every rank holds whole under tensor parallel, with their parameters
    (:func:`snapeval.memory.sharding.whole_on_every_rank`): norms and routers, and what the family's TP
    plan leaves whole (DeepSeek-V3's MLA attention); None where the config does not give its parts' sizes
    (a parameter count given alone): every weight split evenly."""

    @property
    def replicated_parameters(self) -> int:
        """Parameters every rank holds whole under tensor parallel (the rest are split)."""
        return sum(count for _, count in self.replicated or ())

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
    num_kv_heads = kv_heads(fields, heads)
    kv_lora_rank = optional_int(fields, "kv_lora_rank")
    rope_dim = require_int(fields, "qk_rope_head_dim") if kv_lora_rank else None
    window, sliding_layers = sliding_window_layers(fields, layers)
    known_parameters = num_parameters or optional_int(fields, "_num_parameters")
    label = name or fields.get("_name_or_path") or fields.get("model_type") or "model"
    return ModelGeometry(
        name=label,
        source=source or fields.get("_source") or label,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim(fields),
        num_parameters=known_parameters or estimate_parameters(fields),
        parameters_estimated=not known_parameters,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim,
        sliding_window=window,
        num_sliding_layers=sliding_layers,
        max_positions=optional_int(fields, "max_position_embeddings"),
        checkpoint_dtype=_checkpoint_dtype(fields),
        replicated=_replicated(fields, parts_needed=not known_parameters),
    )


def _checkpoint_dtype(fields: Mapping[str, Any]) -> str | None:
    """``fp8`` for a config whose ``quantization_config`` stores FP8 weights, else None."""
    quantization = fields.get("quantization_config")
    return "fp8" if isinstance(quantization, Mapping) and quantization.get("quant_method") == "fp8" else None


def _replicated(fields: Mapping[str, Any], parts_needed: bool) -> tuple[tuple[str, int], ...] | None:
    """:attr:`ModelGeometry.replicated` of a config's ``fields``; None where they do not size the parts
    and the parameter count came from elsewhere (``parts_needed`` False), else the missing field's error."""
    try:
        return tuple(whole_on_every_rank(fields).items())
    except SnapevalError:
        if parts_needed:
            raise
        return None


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
        count = sum(kind == SLIDING_ATTENTION for kind in layer_kinds(config, num_layers))
    elif "use_sliding_window" in config:
        full_layers = min(optional_int(config, "max_window_layers") or 0, num_layers)
        count = num_layers - full_layers if config["use_sliding_window"] else 0
    elif pattern := optional_int(config, "sliding_window_pattern"):
        count = num_layers - num_layers // pattern
    else:
        count = num_layers
    return (window, count) if count else (None, 0)


def load_geometry(model: str) -> ModelGeometry:
    """The geometry of a ``conf/model`` name, a local ``config.json`` (or its directory), or a Hub id.

    A name or a Hub id whose config ships with snapeval is read offline; any other Hub id is fetched.
    """
    name = model_aliases().get(model, model)
    source = model_source(name)
    if source is not None:
        return _geometry_of_source(source, name=name)
    path = Path(model).expanduser()
    if path.exists() or path.suffix == ".json" or model.startswith((".", "/", "~")):
        return _local_geometry(path, name=model)
    if "/" in model:
        return _geometry_of_source(model, name=model)
    raise SnapevalError(
        f"unknown model {model!r}; choose one of {known_names()}; "
        "or pass a local config.json path or a Hugging Face Hub id",
        "model",
    )


def _geometry_of_source(source: str, name: str) -> ModelGeometry:
    """The geometry of a Hub id (shipped, else fetched) or of a local model folder."""
    shipped = shipped_config(source)
    if shipped is not None:
        return geometry_from_config(shipped, name=name, source=source)
    if Path(source).expanduser().exists():
        return _local_geometry(Path(source).expanduser(), name=name)
    return _load_from_hub(source, name=name)


def _local_geometry(path: Path, name: str) -> ModelGeometry:
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        raise SnapevalError(f"no config.json at {str(path)!r}", "model")
    return geometry_from_config(read_json(config_file), name=name, source=str(config_file))


def _config_dict(config: PretrainedConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a config dict or a transformers config (of its text model, if multimodal); the
    dict's own ``_`` fields (such as ``_num_parameters``) are kept."""
    if isinstance(config, Mapping):
        text_config = config.get("text_config")
        if not isinstance(text_config, Mapping) or "num_hidden_layers" in config:
            return dict(config)
        return {**text_config, **{key: value for key, value in config.items() if key.startswith("_")}}
    text_config = config.get_text_config()
    fields = text_config.to_dict()
    fields.update({key: getattr(text_config, key) for key in text_config.attribute_map})
    return fields


def _load_from_hub(repo_id: str, name: str) -> ModelGeometry:
    from huggingface_hub.errors import LocalEntryNotFoundError
    from transformers import AutoConfig

    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)  # no retry warnings: the failure is reported once, below
    try:
        config = AutoConfig.from_pretrained(repo_id)
    except (OSError, ValueError) as exc:
        choices = f"pass a local config.json path or a model name: {known_names()}"
        if _caused_by(exc, LocalEntryNotFoundError):
            reason = f"the Hugging Face Hub is unreachable and {repo_id!r} is not in the local cache"
        else:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            reason = f"could not load the config of {repo_id!r} from the Hugging Face Hub ({detail})"
        raise SnapevalError(f"{reason}; {choices}", "model") from exc
    finally:
        hub_logger.setLevel(level)
    return geometry_from_config(config, name=name, source=repo_id)


def _caused_by(exc: BaseException | None, kind: type[BaseException]) -> bool:
    while exc is not None:
        if isinstance(exc, kind):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
