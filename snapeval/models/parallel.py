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
from snapeval.couplings import MOE_TENSOR_PARALLEL, at_least, transformers_version
from snapeval.errors import SnapevalError
from snapeval.models.rendezvous import rendezvous

TIMEOUT_S = 600  # a collective that waits longer than this on a peer ends the rank (NCCL/gloo timeout)
EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")  # how configs name a MoE's experts


def text_config(config: Any) -> Any:
    """The config of the language model: ``config.text_config`` for a multimodal wrapper, else ``config``."""
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def tp_plan(config: Any) -> dict[str, str]:
    """The base model's TP plan that ``config`` carries (its class's, unless set on it); {} if none."""
    return dict(getattr(text_config(config), "base_model_tp_plan", None) or {})


def check_tensor_parallel(config: Any, size: int) -> None:
    """Refuse, in one line, a model ``size`` ranks cannot split (see the module docstring). No torch:
    run it on the config, before any weight loads."""
    if size <= 1:
        return
    text = text_config(config)
    family = getattr(text, "model_type", None) or type(text).__name__
    if getattr(text, "kv_lora_rank", None):
        raise SnapevalError(
            f"{family}: MLA caches one latent head shared by all query heads, which tensor parallel cannot "
            f"split across {size} ranks (run it on one device)",
            FIELD,
        )
    experts = next((getattr(text, name) for name in EXPERT_COUNTS if getattr(text, name, None)), None)
    if experts and not at_least(MOE_TENSOR_PARALLEL):
        raise SnapevalError(
            f"{family}: tensor parallel over its {experts} experts is exact from transformers "
            f"{MOE_TENSOR_PARALLEL} (installed: {transformers_version()}); upgrade it or run on one device",
            FIELD,
        )
    if not tp_plan(config):
        raise SnapevalError(
            f"{family}: transformers has no tensor-parallel plan for this family, so it cannot run on {size} "
            "ranks (run it on one device)",
            FIELD,
        )
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


def local_heads(count: int, size: int) -> int:
    """How many of ``count`` heads one of ``size`` ranks holds (``count`` divisible by ``size``)."""
    return count // size


def tp_load_arguments(world: World) -> dict[str, Any]:
    """What ``from_pretrained`` takes to load a model split across ``world`` by its family's TP plan:
    ``distributed_config=DistributedConfig(tp_plan="auto")`` where transformers takes it (5.17 on:
    ``tp_plan=`` is deprecated there), else ``tp_plan="auto"`` (5.2 to 5.16); nothing for a world of one."""
    if not world.parallel:
        return {}
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:
        return {"tp_plan": "auto"}
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
