"""What tests/test_tensor_parallel.py runs on every rank (``torchrun ... tests/tensor_parallel_worker.py``)
and, in a world of one, in the test's own process: every method on the one-by-one generator, the
continuous batcher (each method alone, and every method in rows of one shared prefill), R-KV's
decode-time eviction and sampled decoding (SnapStream; each rank draws from the same gathered logits), on
the tiny models saved in the folders it is given (MLA: every method but re-rotated sinks, which it
refuses). Each rank saves ``rank<r>.pt``: ``runs``, (family, method, path) -> (tokens, the logits of every
forward's last position), and ``kept``, (family, method) -> the positions every layer's cache holds after
the prefill's selection and after decoding (R-KV's re-selections), on the one-by-one path; and
``turns``, family -> (:func:`several_turns`' answers, the logits of every forward): requests of 2-3 turns on
one compressed context in rows of one batcher.

``python tests/tensor_parallel_worker.py OUT [--style=ep] FOLDER...`` (under torchrun: ``--nproc-per-node
2``; ``--style=ep``: the experts placed by the family's expert-parallel plan, ``model.tp_style=ep``).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script by torchrun
    sys.path.insert(0, str(ROOT))

from snapeval.cache import build_cache, install  # noqa: E402
from snapeval.cli.world import launcher_world  # noqa: E402
from snapeval.decode.continuous import Answer, ContinuousBatcher, Request  # noqa: E402
from snapeval.decode.generation import generate  # noqa: E402
from snapeval.decode.sampling import Sampling  # noqa: E402
from snapeval.errors import SnapevalError  # noqa: E402
from snapeval.models.parallel import (  # noqa: E402
    TP,
    check_tensor_parallel,
    end_together,
    init_process_group,
    tp_load_arguments,
)

VOCAB = 512
PROMPT_LENGTH = 128
NEW_TOKENS = 10
SETTINGS = {
    "full": {"method": "full"},
    "streaming_llm": {"method": "streaming_llm", "budget": 64, "sinks": 4},
    "streaming_llm_rerotate": {"method": "streaming_llm", "budget": 64, "sinks": 4, "rerotate": True},
    "snapkv": {"method": "snapkv", "budget": 64, "window": 8, "kernel": 5},
    "snapstream": {"method": "snapstream", "budget": 80, "window": 8, "kernel": 5, "sinks": 4, "ring": 12},
    "sage_kv": {"method": "sage_kv", "budget": 64, "sinks": 4, "recent": 12, "window": 2},
    "speculative_prefill": {"method": "speculative_prefill", "budget": 80, "window": 8, "chunk": 16},
    "rkv": {"method": "rkv", "budget": 48, "buffer": 4, "window": 4, "kernel": 5, "mix_lambda": 0.9},
}
"""Every built-in method but kvpress (an optional extra), each evicting from the 128-token prompt; R-KV
re-selects every 4 decoded tokens, from scores led by its recorded queries (``mix_lambda`` 0.9), so that
a rank whose recorded queries are not its own heads' answers otherwise."""


SAMPLED = Sampling(do_sample=True, temperature=0.9, top_p=0.95, seed=7)
TURNS = {"full": 3, "snapkv": 2, "snapstream": 3, "streaming_llm": 2}
"""The methods that answer several turns on one context (:func:`several_turns`), and how many; SnapStream's
are sampled."""
FOLLOWUP_LENGTHS = (5, 4)
"""The random ids of each follow-up (the first one led by the token that ends a turn)."""


def prompt(seed: int = 1) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (PROMPT_LENGTH,), generator=generator).tolist()


class LogitTap:
    """The logits of the last position of every forward of the model (gathered, as the model returns them)."""

    def __init__(self, model):
        self.outputs: list[torch.Tensor] = []
        model.register_forward_hook(self._record)

    def _record(self, module, args, output):
        self.outputs.append(output.logits[:, -1].detach().float().clone())

    def take(self) -> list[torch.Tensor]:
        outputs, self.outputs = self.outputs, []
        return outputs


def load(folder: str, world, style: str = TP):
    from transformers import AutoConfig, AutoModelForCausalLM

    check_tensor_parallel(AutoConfig.from_pretrained(folder), world.size, style)
    arguments = tp_load_arguments(world, style)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **arguments)
    model.generation_config.eos_token_id = None  # random weights: always NEW_TOKENS tokens
    return install(model.eval())


def family_settings(model, settings: dict[str, dict]) -> dict[str, dict]:
    """``settings`` less what ``model``'s family refuses: re-rotated sinks under MLA (its rotary key is
    cached apart from the latent)."""
    if not getattr(model.config, "kv_lora_rank", None):
        return settings
    return {method: params for method, params in settings.items() if not params.get("rerotate")}


def held_positions(cache) -> list[list[list[int]]]:
    """Each layer's held positions (heads x slots) of a one-row cache, in slot order."""
    return [layer.positions[0].tolist() for layer in cache.layers]


def run_family(model, settings: dict[str, dict]) -> tuple[dict, dict, tuple]:
    """(method, path) -> (tokens, logits of every forward) on every path; method -> the positions held
    after the prefill and after decoding (:func:`held_positions`); and (:func:`several_turns`' answers,
    logits of every forward)."""
    tap, ids, runs, kept = LogitTap(model), prompt(), {}, {}
    settings = family_settings(model, settings)
    for method, params in settings.items():
        prefilled = build_cache(params)
        generate(model, ids, prefilled, 1, set())  # the first token comes from the prefill alone
        tap.take()
        cache = build_cache(params)
        tokens = generate(model, ids, cache, NEW_TOKENS, set()).tokens
        runs[method, "generate"] = (tokens, tap.take())
        kept[method] = (held_positions(prefilled), held_positions(cache))
        (tokens,) = batch(model, [Request(tuple(ids), params, NEW_TOKENS, tag=method)])
        runs[method, "batcher"] = (tokens, tap.take())
    requests = [Request(tuple(ids), params, NEW_TOKENS, tag=m) for m, params in settings.items()]
    runs["every method", "batcher rows, shared prefill"] = (batch(model, requests), tap.take())
    params = settings.get("snapstream", next(iter(settings.values())))  # sampled: every rank draws alike
    tokens = generate(model, ids, build_cache(params), NEW_TOKENS, set(), SAMPLED).tokens
    runs["snapstream sampled", "generate"] = (tokens, tap.take())
    requests = [Request(tuple(ids), params, NEW_TOKENS, replace(SAMPLED, seed=s), tag=s) for s in (1, 2)]
    runs["snapstream sampled", "batcher rows"] = (batch(model, requests), tap.take())
    end = runs["full", "batcher"][0][3]  # a token the full cache draws: made the end of a turn
    return runs, kept, (several_turns(model, settings, ids, end), tap.take())


def several_turns(model, settings: dict[str, dict], ids: list[int], end: int) -> list[tuple]:
    """Each method of :data:`TURNS` answering its turns on ``ids`` (its follow-ups: :data:`FOLLOWUP_LENGTHS`
    random ids, the first led by ``end``, which ends a turn), beside a one-turn full cache, in rows of one
    batcher: per request (its follow-ups, each turn's tokens, each turn's stop, its row's kv_bytes)."""
    generator = torch.Generator().manual_seed(2)
    followups = [tuple(torch.randint(3, VOCAB, (n,), generator=generator).tolist()) for n in FOLLOWUP_LENGTHS]
    followups[0] = (end, *followups[0])
    requests = [Request(tuple(ids), settings["full"], NEW_TOKENS, tag="one turn")]
    for method, turns in TURNS.items():
        sampling = SAMPLED if method == "snapstream" else Sampling()
        fed = followups[: turns - 1]
        requests.append(
            Request(
                tuple(ids),
                settings[method],
                NEW_TOKENS,
                sampling,
                frozenset({end}),
                tag=method,
                followups=fed,
            )
        )
    return [
        (
            answer.request.followups,
            [t.tokens for t in answer.turns],
            [t.stopped for t in answer.turns],
            answer.kv_bytes,
        )
        for answer in answers(model, requests)
    ]


def batch(model, requests: list[Request]) -> list[list[int]]:
    """The tokens of every request, decoded in rows of one continuous batcher."""
    return [answer.tokens for answer in answers(model, requests)]


def answers(model, requests: list[Request]) -> list[Answer]:
    """The answer of every request, decoded in rows of one continuous batcher."""
    got = {}
    ContinuousBatcher(model, len(requests)).run(requests, lambda a: got.__setitem__(a.request.tag, a))
    return [got[request.tag] for request in requests]


def main(out: str, folders: list[str], settings: dict[str, dict] = SETTINGS, style: str = TP) -> dict:
    world = launcher_world()
    init_process_group(world)
    torch.manual_seed(0)
    results = {"runs": {}, "kept": {}, "turns": {}}
    for folder in folders:
        family = Path(folder).name
        runs, kept, results["turns"][family] = run_family(load(folder, world, style), settings)
        results["runs"].update({(family, *key): run for key, run in runs.items()})
        results["kept"].update({(family, method): held for method, held in kept.items()})
    Path(out).mkdir(parents=True, exist_ok=True)
    torch.save(results, Path(out) / f"rank{world.rank}.pt")
    return results


if __name__ == "__main__":
    torch.set_num_threads(1)
    out, *folders = sys.argv[1:]
    style = folders.pop(0).removeprefix("--style=") if folders[0].startswith("--style=") else TP
    try:
        main(out, folders, style=style)
    except SnapevalError as error:
        end_together(error)
