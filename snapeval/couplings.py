"""Every place snapeval leans on another library's internals, and the versions each was tested on.

The engine rides on conventions of transformers that no API promises: the keyword that carries the cache
into an attention module, ``Cache.update`` running before the attention call, the attention and mask
interfaces, SDPA's own attention function. lm-eval is driven through its registry and its model base
class (and its HTTP clients' parse step, to see what a server counted of a prompt), kvpress through a
private helper of its decoding press. Each coupling is listed here once, with what uses it; :func:`check`
imports each and names, in one line, the one that moved. The supported ranges
are pinned in ``pyproject.toml`` and tested at both ends by ``.ci/run`` (``scripts/test-transformers``
runs the same tests against any newer release). Standard library only: importing this loads nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata

from snapeval.errors import SnapevalError

TESTED = {  # distribution -> (lowest, highest) version the suite passed on; pyproject pins these ends
    "transformers": ("5.2.0", "5.24.0"),
    "lm_eval": ("0.4.10", "0.4.13"),
    "kvpress": ("0.5.5", "0.5.5"),
}

MLA_LATENT_CACHE = "5.15.0"
"""The first transformers whose MLA attention (DeepSeek-V3 and its kin) hands the cache its latent and
rotary key, which the engine selects from; before it the cache took per-head keys and values."""

MOE_TENSOR_PARALLEL = "5.24.0"
"""The first transformers whose tensor-parallel plans split a mixture of experts exactly here (Qwen3-MoE,
GPT-OSS on 2 gloo ranks: tests/test_tensor_parallel.py); at 5.2.0 Qwen3-MoE's TP answers differ from
its one-device answers and GPT-OSS does not load on CPU. Releases between are untested."""

EXPERT_PARALLEL = "5.24.0"
"""The first transformers whose ``DistributedConfig`` takes ``ep_size``, placing a mixture's experts by
its family's ``base_model_ep_plan`` (``model.tp_style=ep``); before it, ``enable_expert_parallel``
took the TP plan's expert rules instead. Releases between are untested."""

CACHE_PARAMETERS = ("cache", "past_key_values")
"""The names under which transformers hands a cache to a model and its attention modules: ``cache`` from
5.24 on, ``past_key_values`` before (a deprecated alias from 5.24, to go in 5.40)."""


@dataclass(frozen=True)
class Coupling:
    """One symbol of another library that snapeval uses: ``module``.``symbol`` (an attribute path)."""

    package: str
    module: str
    symbol: str
    use: str
    since: str = ""  # the first version of ``package`` where snapeval uses it ("": all tested)

    def applies(self) -> bool:
        """Whether the installed ``package`` is one snapeval uses this symbol of."""
        return not self.unused_because()

    def unused_because(self) -> str:
        """Why snapeval uses no ``package`` installed here for this symbol ("" when it does): none is
        installed, or the installed one is older than ``since``; the versions named."""
        version = installed_version(self.package)
        if version is None:
            return f"{self.package} is not installed ({supported_range(self.package)})"
        if self.since and not at_least(self.since, self.package):
            return (
                f"{self.package} {version} is older than {self.since}, the first snapeval uses {self.name} of"
            )
        return ""

    @property
    def name(self) -> str:
        return f"{self.module}.{self.symbol}"


COUPLINGS = (
    Coupling("transformers", "transformers", "AttentionInterface", "registers the snapeval attention"),
    Coupling("transformers", "transformers.masking_utils", "AttentionMaskInterface", "its mask function"),
    Coupling("transformers", "transformers.masking_utils", "sdpa_mask", "prefill masks (SDPA base)"),
    Coupling("transformers", "transformers.masking_utils", "eager_mask", "prefill masks (eager base)"),
    Coupling(
        "transformers",
        "transformers.integrations.sdpa_attention",
        "sdpa_attention_forward",
        "the base attention the snapeval attention calls",
    ),
    Coupling("transformers", "transformers.cache_utils", "Cache", "base of every snapeval cache"),
    Coupling("transformers", "transformers.cache_utils", "CacheLayerMixin", "base of a cache layer"),
    Coupling("transformers", "transformers", "DynamicCache", "probes what a model caches per token"),
    Coupling(
        "transformers",
        "transformers.models.auto.modeling_auto",
        "MODEL_FOR_CAUSAL_LM_MAPPING",
        "which families load as causal LMs",
    ),
    Coupling(
        "transformers",
        "transformers",
        "PreTrainedModel.set_attn_implementation",
        "switches a model to the snapeval attention",
    ),
    Coupling(
        "transformers",
        "transformers.models.deepseek_v3.modeling_deepseek_v3",
        "DeepseekV3Attention.expand_kv",
        "MLA: expanded by the snapeval attention at prefill, absorbed at decode",
        since=MLA_LATENT_CACHE,
    ),
    Coupling(
        "transformers",
        "transformers",
        "DeepseekV3Config.base_model_tp_plan",
        "model.tp: what a family's TP plan splits (MLA attention whole), its refusals, the weights per rank",
    ),
    Coupling(
        "transformers",
        "transformers.models.auto.configuration_auto",
        "CONFIG_MAPPING",
        "the memory estimator: a family's TP plan from its model_type",
    ),
    Coupling(
        "transformers",
        "transformers",
        "DeepseekV3Config.base_model_ep_plan",
        "model.tp_style=ep: whether a family has an expert-parallel plan",
        since=EXPERT_PARALLEL,
    ),
    Coupling(
        "transformers",
        "transformers.distributed",
        "DistributedConfig",
        "model.tp_style=ep: its ep_size places experts by the EP plan across the ranks",
        since=EXPERT_PARALLEL,
    ),
    Coupling("lm_eval", "lm_eval.api.model", "LM", "base of the lm-eval model"),
    Coupling("lm_eval", "lm_eval.api.registry", "register_model", "registers the lm-eval model"),
    Coupling("lm_eval", "lm_eval.api.registry", "model_registry", "lazy registration by the .pth plugin"),
    Coupling("lm_eval", "lm_eval.models", "__name__", "the module whose import the .pth plugin watches"),
    Coupling("lm_eval", "lm_eval.tasks", "TaskManager.__init__", "the .pth plugin adds snapeval's tasks"),
    Coupling("lm_eval", "lm_eval.tasks.aime.utils", "process_results", "the lm_eval AIME scorer"),
    Coupling("lm_eval", "lm_eval.api.registry", "get_model", "model.backend: an lm-eval client by name"),
    Coupling("lm_eval", "lm_eval.api.instance", "Instance", "model.backend: a request to the client"),
    Coupling(
        "lm_eval",
        "lm_eval.models.api_models",
        "TemplateAPI.parse_generations",
        "model.backend: a subclass reads the server's usage.prompt_tokens, which lm-eval drops, where its "
        "HTTP clients parse an answer (0.4.10 and 0.4.13 call it on each answer's JSON and return its items "
        "as they are); a failure's line names its max_retries and timeout",
    ),
    Coupling("kvpress", "kvpress", "DecodingPress", "kvpress's decoding presses (cache.decoding=true)"),
    Coupling("kvpress", "kvpress", "ScorerPress", "the presses a decoding press takes"),
    Coupling("kvpress", "kvpress.utils", "compute_n_kept", "slots a decoding press keeps"),
    Coupling(
        "kvpress",
        "kvpress",
        "DecodingPress._find_target_compression_ratio",
        "the ratio a decoding press compresses to (private)",
    ),
)


def installed_version(package: str) -> str | None:
    """The installed version of distribution ``package`` (``lm_eval`` or ``lm-eval``), or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def transformers_version() -> str:
    return installed_version("transformers") or "(not installed)"


def supported_range(package: str = "transformers") -> str:
    """``supported: 5.2.0-5.24.0`` for ``package``."""
    low, high = TESTED[package]
    return f"supported: {low}-{high}"


def engine_bypassed(layer_idx: int) -> SnapevalError:
    """The error of a cache whose layer ``layer_idx`` received keys that the snapeval attention never
    took: transformers (or a model not prepared with ``snapeval.cache.install``) went around the engine."""
    return SnapevalError(
        f"transformers {transformers_version()} called layer {layer_idx}'s attention without the snapeval "
        f"cache: the engine was bypassed (a model not prepared by snapeval.cache.install, or a transformers "
        f"outside the tested range); {supported_range()}"
    )


def at_least(version: str, package: str = "transformers") -> bool:
    """Whether the installed ``package`` is ``version`` or newer."""
    from packaging.version import Version  # a dependency of transformers; only needed here

    installed = installed_version(package)
    return installed is not None and Version(installed) >= Version(version)


def resolve(coupling: Coupling) -> object:
    """The object ``coupling`` names; a :class:`SnapevalError` naming it, the installed version and the
    tested range if it is gone."""
    try:
        found: object = importlib.import_module(coupling.module)
        for part in coupling.symbol.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        version = installed_version(coupling.package) or "(not installed)"
        raise SnapevalError(
            f"{coupling.package} {version} has no {coupling.name}, which snapeval uses ({coupling.use}): "
            f"{type(error).__name__}: {error}; {supported_range(coupling.package)}",
            coupling.package,
        ) from None
    return found


def check(package: str | None = None) -> list[Coupling]:
    """Resolve every coupling (of ``package`` only, if given) whose package is installed; the couplings
    checked. Raises on the first that moved."""
    checked = []
    for coupling in COUPLINGS:
        if package not in (None, coupling.package) or not coupling.applies():
            continue
        resolve(coupling)
        checked.append(coupling)
    return checked


def main(argv: list[str] | None = None) -> int:
    """``python -m snapeval.couplings [--expect floor|ceiling]``: each coupled package's installed and
    tested versions and whether its couplings resolve; exit 1 if one moved, a version is outside its
    tested range, or (``--expect``) transformers is not exactly that end of it."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m snapeval.couplings", description=main.__doc__)
    parser.add_argument("--expect", choices=("floor", "ceiling"), help="transformers must be this end")
    args = parser.parse_args(argv)
    from packaging.version import Version

    failed = False
    for package, (low, high) in TESTED.items():
        version = installed_version(package)
        inside = version is not None and Version(low) <= Version(version) <= Version(high)
        try:
            status = f"{len(check(package))} couplings resolve" if version else "not installed"
        except SnapevalError as error:
            status, failed = str(error), True
        failed |= version is not None and not inside
        range_note = "" if inside or version is None else " (OUTSIDE the tested range)"
        print(f"{package} {version or '-'}{range_note}: tested {low}-{high}; {status}")
    if args.expect:
        wanted = TESTED["transformers"][0 if args.expect == "floor" else 1]
        if transformers_version() != wanted:
            print(f"transformers {transformers_version()} is not the {args.expect} {wanted}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
