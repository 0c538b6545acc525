"""The launcher's world: tensor parallel under torchrun, on transformers' TP plans.

``snapeval run --nproc N`` or ``torchrun --nproc-per-node N`` starts N processes, whose world
:func:`snapeval.cli.world.launcher_world` reads (a plain ``python`` run is a world of one). A world
larger than one is tensor parallel: every rank loads the same model with transformers' TP plan
(:func:`tp_load_arguments`), which splits attention heads and MLP columns across the ranks and gathers the
LM head's output, so every rank sees the same logits and takes the same token. :func:`init_process_group`
starts the process group (NCCL on CUDA, gloo on CPU) once the ranks meet
(:mod:`snapeval.models.rendezvous`), with a timeout, and binds a rank to its device;
:func:`end_process_group` ends it in order.

:func:`check_tensor_parallel` refuses, in one line and before any weight loads, what TP cannot split: a
family whose config class carries no TP plan, head counts the world does not divide (each rank must hold
whole KV heads and their whole GQA groups), MLA (DeepSeek-V2/V3: its shared latent is one cache head
that cannot be split; replicating it on every rank is not measured here, so it is refused), and a mixture
of experts below the transformers release whose plans split experts exactly here
(:data:`snapeval.couplings.MOE_TENSOR_PARALLEL`).

Only the writer (rank 0, :func:`snapeval.cli.world.writing_rank`) writes results; the others compute
alongside it.
Importing this module loads no torch.
"""

from __future__ import annotations

import atexit
import inspect
import sys
from contextlib import suppress
from typing import Any, NoReturn

from snapeval.cli.world import FIELD, World, launcher_world
from snapeval.configs.root import RENDEZVOUS_S
from snapeval.couplings import EXPERT_PARALLEL, MOE_TENSOR_PARALLEL, at_least, transformers_version
from snapeval.errors import SnapevalError
from snapeval.models.rendezvous import rendezvous

TIMEOUT_S = 600  # a collective that waits longer than this on a peer ends the rank (NCCL/gloo timeout)
EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")  # how configs name a MoE's experts
TP, EP = "tp", "ep"  # model.tp_style: experts split like the rest by the TP plan, or placed by the EP plan
STYLE_FIELD = "model.tp_style"


def text_config(config: Any) -> Any:
    """The config of the language model: ``config.text_config`` for a multimodal wrapper, else ``config``."""
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def tp_plan(config: Any) -> dict[str, str]:
    """The base model's TP plan that ``config`` carries (its class's, unless set on it); {} if none."""
    return dict(getattr(text_config(config), "base_model_tp_plan", None) or {})


def ep_plan(config: Any) -> dict[str, str]:
    """The base model's expert-parallel plan that ``config`` carries (transformers 5.24: DeepSeek-V3,
    Qwen3-MoE, GPT-OSS, Mixtral); {} if none."""
    return dict(getattr(text_config(config), "base_model_ep_plan", None) or {})


def split_attention(config: Any) -> list[str]:
    """The rules of ``config``'s TP plan that split its attention modules (``layers.*.self_attn.q_proj``);
    [] where the plan leaves attention whole on every rank (DeepSeek-V3's, from transformers 5.24)."""
    return sorted(rule for rule in tp_plan(config) if ".self_attn." in rule)


def expert_count(config: Any) -> int | None:
    """How many routed experts ``config``'s model has (None: no mixture of experts)."""
    text = text_config(config)
    return next((getattr(text, name) for name in EXPERT_COUNTS if getattr(text, name, None)), None)


def check_tensor_parallel(config: Any, size: int, style: str = TP) -> None:
    """Refuse, in one line, a model ``size`` ranks cannot split in ``style`` (``tp`` or ``ep``: see the
    module docstring). No torch: run it on the config, before any weight loads."""
    if size <= 1:
        return
    text = text_config(config)
    family = getattr(text, "model_type", None) or type(text).__name__
    experts = expert_count(config)
    if experts and not at_least(MOE_TENSOR_PARALLEL):
        raise SnapevalError(
            f"{family}: tensor parallel over its {experts} experts is exact from transformers "
            f"{MOE_TENSOR_PARALLEL} (installed: {transformers_version()}); upgrade it or run on one device",
            FIELD,
        )
    if style == EP:
        check_expert_parallel(config, size, family, experts)
    if not tp_plan(config):
        raise SnapevalError(
            f"{family}: transformers has no tensor-parallel plan for this family, so it cannot run on {size} "
            "ranks (run it on one device)",
            FIELD,
        )
    if getattr(text, "kv_lora_rank", None):
        split = [rule.split(".self_attn.")[1] for rule in split_attention(config)]
        if split:
            raise SnapevalError(
                f"{family}: transformers' TP plan splits MLA attention (self_attn {', '.join(split)}), "
                "leaving each rank part of the latent's heads: not measured here (run it on one device)",
                FIELD,
            )
        return  # the plan leaves attention whole: every rank holds every head and the whole latent
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    for name, count in (("query", heads), ("KV", kv_heads)):
        if isinstance(count, int) and count % size:
            divisors = [n for n in range(2, kv_heads + 1) if kv_heads % n == 0 and heads % n == 0]
            choices = ", ".join(map(str, divisors)) or "none above 1"
            raise SnapevalError(
                f"{family} has {heads} query and {kv_heads} KV heads: {size} ranks cannot split its {count} "
                f"{name} heads (ranks that can: {choices})",
                FIELD,
            )


def check_expert_parallel(config: Any, size: int, family: str, experts: int | None) -> None:
    """Refuse, in one line naming ``model.tp_style``, an expert-parallel run transformers cannot make: no
    mixture of experts, no EP plan for the family (or a release that takes none), or experts ``size``
    ranks cannot share out evenly."""
    if not experts:
        raise SnapevalError(f"{family} has no experts to place across ranks: use tp", STYLE_FIELD)
    if not ep_plan(config) or not takes_expert_parallel():
        raise SnapevalError(
            f"{family}: transformers {transformers_version()} has no expert-parallel plan for this family "
            "(use tp)",
            STYLE_FIELD,
        )
    if experts % size:
        raise SnapevalError(
            f"{family}: {size} ranks cannot hold equal shares of its {experts} experts (use tp, or a rank "
            "count that divides them)",
            STYLE_FIELD,
        )


def takes_expert_parallel() -> bool:
    """Whether the installed transformers places experts by their EP plan: its ``DistributedConfig``
    takes ``ep_size`` (:data:`snapeval.couplings.EXPERT_PARALLEL`)."""
    return at_least(EXPERT_PARALLEL)


def local_heads(count: int, size: int) -> int:
    """How many of ``count`` heads one of ``size`` ranks holds (``count`` divisible by ``size``)."""
    return count // size


def tp_load_arguments(world: World, style: str = TP) -> dict[str, Any]:
    """What ``from_pretrained`` takes to load a model split across ``world`` by its family's TP plan:
    ``distributed_config=DistributedConfig(tp_plan="auto")`` where transformers takes it (5.17 on:
    ``tp_plan=`` is deprecated there), else ``tp_plan="auto"`` (5.2 to 5.16); nothing for a world of one.
    ``style`` ``ep``: the experts placed by the family's EP plan instead (``ep_size`` the world's: each
    rank holds its share of whole experts, the rest of the TP plan as under ``tp``)."""
    if not world.parallel:
        return {}
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:
        return {"tp_plan": "auto"}
    if style == EP:
        config = DistributedConfig(tp_plan="auto", tp_size=world.size, ep_size=world.size)
        return {"distributed_config": config}
    if "tp_plan" in inspect.signature(DistributedConfig).parameters:
        return {"distributed_config": DistributedConfig(tp_plan="auto")}
    return {"tp_plan": "auto"}


def init_process_group(world: World, rendezvous_s: float = RENDEZVOUS_S, timeout_s: float = TIMEOUT_S) -> Any:
    """Start the process group of ``world`` (NCCL on CUDA, gloo on CPU), its ranks met within
    ``rendezvous_s`` (:func:`rendezvous`), with a collective timeout of ``timeout_s``, unless started
    already (:func:`end_process_group` ends it), and return this rank's device (``cuda:LOCAL_RANK`` or
    cpu)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda and world.local_rank >= torch.cuda.device_count():
        raise SnapevalError(
            f"rank {world.rank} is local rank {world.local_rank}, but this node has "
            f"{torch.cuda.device_count()} CUDA device(s): start at most that many processes per node",
            FIELD,
        )
    device = torch.device(f"cuda:{world.local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world.parallel and not dist.is_initialized():
        store = rendezvous(world, rendezvous_s)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=store,
            rank=world.rank,
            world_size=world.size,
            timeout=timedelta(seconds=timeout_s),
        )
        atexit.register(end_process_group)  # a rank that exits with it alive may abort (gloo)
    return device


def end_process_group() -> None:
    """End the process group in order, if one is started: a barrier first, so that no rank tears its
    connections down while a peer still talks over them (gloo aborts a process whose peer closes
    mid-message), then its end. A peer already gone skips the barrier's wait."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    with suppress(Exception):  # a peer gone: nothing left to wait for
        dist.barrier()
    dist.destroy_process_group()


LOST_PEER_WORDS = ("gloo", "NCCL", "Connection closed", "Connection reset", "timed out", "Timeout")
"""Words of the errors torch.distributed raises when a peer is gone (a broken connection, a timeout)."""


def lost_peer(error: BaseException) -> SnapevalError | None:
    """The one line of a rank whose tensor-parallel peers are gone: ``error`` is a collective's timeout or
    a broken connection (:data:`TIMEOUT_S`); None for any other error, or outside tensor parallel. No
    barrier follows it: the peers it would wait for are gone."""
    world = launcher_world()
    if not world.parallel or "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    text = str(error).strip()
    if not isinstance(error, getattr(dist, "DistError", ())) and not any(w in text for w in LOST_PEER_WORDS):
        return None
    cause = text.splitlines()[0][:160] if text else type(error).__name__
    return SnapevalError(
        f"rank {world.rank} of {world.size}: a peer of the tensor-parallel run is gone or timed out "
        f"({cause}); the run is closed as failed, every stored sample whole",
        FIELD,
    )


def end_together(error: SnapevalError) -> NoReturn:
    """End this rank on ``error``, a refusal every rank reaches alike (one taken from the config): its one
    line on stderr, then a barrier, so that no rank ends (and has the launcher stop the others) before
    every rank has printed its line; exit code 2."""
    print(f"error: {error}", file=sys.stderr, flush=True)
    if "torch.distributed" in sys.modules:
        end_process_group()
    raise SystemExit(2)
