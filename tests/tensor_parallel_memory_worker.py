"""What tests/test_tensor_parallel_memory.py runs on every rank (``torchrun ... --nproc-per-node 2``) and,
in a world of one, in the test's own process:

* the batcher's pre-flight check (:func:`snapeval.decode.batch_rows.check_rows_fit`) with each rank told a
  different free-memory figure (:data:`FREE`): its decision, "fits" or the refusal's line;
* on the tiny model saved in the folder it is given (when given), the bytes that rank's rows hold: every
  answer's stored ``kv_bytes_per_rank`` and ``kv_bytes`` (the whole row's) from continuous batcher rows
  (:data:`SETTINGS`), and the check's ``row_bytes`` of the rank's cached shapes at each row's slots; and
  the bytes of the rank's own share of the weights (``weights_bytes``).

Each rank writes ``rank<r>.json``.

``python tests/tensor_parallel_memory_worker.py OUT [FOLDER]`` (under torchrun: ``--nproc-per-node 2``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script by torchrun
    sys.path.insert(0, str(ROOT))

from snapeval.cache import install  # noqa: E402
from snapeval.cache.slots import CachedShapes, cached_shapes  # noqa: E402
from snapeval.cli.world import launcher_world  # noqa: E402
from snapeval.decode import batch_rows  # noqa: E402
from snapeval.decode.continuous import ContinuousBatcher, Request  # noqa: E402
from snapeval.errors import SnapevalError  # noqa: E402
from snapeval.models.parallel import (  # noqa: E402
    check_tensor_parallel,
    end_together,
    init_process_group,
    tp_load_arguments,
)

VOCAB = 512
PROMPT_LENGTH = 96
NEW_TOKENS = 6
SHAPES = CachedShapes(2, 2, 16, 16, torch.float32, (None, None))
PLAN = [(64, 4)]  # 4 rows of 64 slots
FREE = {
    "rank 1 short": [10**12, 1],  # rank r is told FREE[case][r] bytes free
    "rank 0 short": [1, 10**12],
    "rank 1 cannot tell": [1, None],
    "both plenty": [10**12, 10**11],
}
SETTINGS = {
    "full": {"method": "full"},
    "snapkv": {"method": "snapkv", "budget": 64},
    "streaming_llm": {"method": "streaming_llm", "budget": 64},
    "rkv": {"method": "rkv", "budget": 48},
}
"""Settings of a method and a budget alone, as the memory estimator builds them."""


def decisions(rank: int) -> dict[str, str]:
    """Case -> this rank's decision on :data:`PLAN` when told :data:`FREE`'s figure for it."""
    read, made = batch_rows.free_bytes, {}
    try:
        for case, figures in FREE.items():
            batch_rows.free_bytes = lambda device, free=figures[rank]: free
            try:
                batch_rows.check_rows_fit(PLAN, SHAPES, torch.device("cpu"))
                made[case] = "fits"
            except SnapevalError as error:
                made[case] = str(error)
    finally:
        batch_rows.free_bytes = read
    return made


def row_figures(folder: str, world) -> dict:
    """Each setting's stored ``kv_bytes_per_rank`` and ``kv_bytes`` and held slots (as the answer counts
    them), and the check's bytes of a row of those slots, on this rank."""
    from transformers import AutoConfig, AutoModelForCausalLM

    check_tensor_parallel(AutoConfig.from_pretrained(folder), world.size)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **tp_load_arguments(world))
    model.generation_config.eos_token_id = None  # random weights: always NEW_TOKENS tokens
    model = install(model.eval())
    generator = torch.Generator().manual_seed(1)
    ids = tuple(torch.randint(3, VOCAB, (PROMPT_LENGTH,), generator=generator).tolist())
    answers = {}
    requests = [Request(ids, params, NEW_TOKENS, tag=method) for method, params in SETTINGS.items()]
    ContinuousBatcher(model, len(requests)).run(requests, lambda a: answers.__setitem__(a.request.tag, a))
    shapes = cached_shapes(model)
    return {
        "weights_bytes": sum(local(parameter).nbytes for parameter in model.parameters()),
        "kv_heads": shapes.kv_heads,
        "kv_bytes_per_rank": {tag: answer.kv_bytes_per_rank for tag, answer in answers.items()},
        "kv_bytes": {tag: answer.kv_bytes for tag, answer in answers.items()},
        "slots": {tag: request.slots_needed for tag, request in zip(SETTINGS, requests, strict=True)},
        "row_bytes": {
            tag: batch_rows.row_bytes(request.slots_needed, shapes)
            for tag, request in zip(SETTINGS, requests, strict=True)
        },
    }


def local(parameter: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``parameter`` (a DTensor under tensor parallel), or ``parameter`` itself."""
    from torch.distributed.tensor import DTensor

    return parameter.to_local() if isinstance(parameter, DTensor) else parameter


def main(out: str, folder: str | None = None) -> dict:
    world = launcher_world()
    init_process_group(world)
    torch.manual_seed(0)
    results = {"decisions": decisions(world.rank)}
    if folder:
        results["rows"] = row_figures(folder, world)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{world.rank}.json").write_text(json.dumps(results))
    return results


if __name__ == "__main__":
    torch.set_num_threads(1)
    try:
        main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    except SnapevalError as error:
        end_together(error)
