"""Speed of a deployed engine against snapeval's own, on the same prompts: llama.cpp's OpenAI-compatible
server (llama-cpp-python[server], serving the embedded SmolLM2 GGUF on 127.0.0.1) through lm-eval's
``local-completions`` client, as ``model.backend=lm_eval:local-completions`` runs it, beside snapeval's
continuous batcher on the dequantized float32 weights.

Both answer the same ``ruler_passkey`` requests (snapeval's prompts: chat template applied, fitted to the
window), greedy, at each ``--concurrency`` (the batcher's rows; the client's ``num_concurrent``). Per
backend and concurrency it prints the wall time, generated tokens/s, how many answers equal snapeval's
engine's at concurrency 1, and, for the server, the share of the wall time snapeval spends outside the
client's calls (making prompt texts, reading answers back): the harness's own cost on an engine.

    python benchmarks/engines.py                                   # 8 prompts at 1k, concurrency 1 and 4
    python benchmarks/engines.py --prompts 2 --max-new-tokens 8 --concurrency 1   # smoke test, ~1 min
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import transformers
from arguments import at_least
from engine import SPEC
from machine import available_cores, cpu_model
from tabulate import tabulate

from snapeval.backends.lm_eval import LmEvalAnswerer, make_client
from snapeval.backends.serve import ServedEngine, free_port
from snapeval.cache import install
from snapeval.cli import one_line_errors
from snapeval.configs.compose import compose_config
from snapeval.configs.setting import CacheSetting
from snapeval.decode.continuous import Answer, ContinuousBatcher, Request
from snapeval.decode.sampling import Sampling
from snapeval.models import load_model, load_tokenizer, resolve_pretrained
from snapeval.run.requests import RequestBuilder
from snapeval.tasks import load_task

READY_S = 180


class TimedClient:
    """An lm-eval client whose ``generate_until`` calls are timed: the engine's share of the wall time
    (the server's work and the client's HTTP), the rest being snapeval's."""

    def __init__(self, client: Any) -> None:
        self.client, self.seconds = client, 0.0

    def generate_until(self, instances: list[Any], disable_tqdm: bool = False) -> list[str]:
        started = time.perf_counter()
        try:
            return self.client.generate_until(instances, disable_tqdm=disable_tqdm)
        finally:
            self.seconds += time.perf_counter() - started


def passkey_requests(tokenizer: Any, args: argparse.Namespace, stop_ids: frozenset[int]) -> list[Request]:
    """The first ``--prompts`` passkey prompts at ``--length`` tokens, as the runner makes them."""
    cfg = compose_config("task=ruler_passkey", f"task.context_length={args.length}")
    task = load_task(cfg["task"], seed=0, limit=args.prompts)
    builder = RequestBuilder.for_task(tokenizer, task, SPEC.max_context, stop_ids)
    full = CacheSetting.of({"method": "full"})
    return [
        builder.request(prompt.messages, args.max_new_tokens, full, Sampling(), tag=prompt.id)
        for prompt in task.prompts(tokenizer)
    ]


def answer_all(answerer: Any, requests: list[Request]) -> tuple[dict[str, list[int]], float]:
    """Every request's answer tokens by tag, and the wall seconds they took."""
    tokens: dict[str, list[int]] = {}

    def on_answer(answer: Answer) -> None:
        tokens[answer.request.tag] = answer.tokens

    started = time.perf_counter()
    answerer.run(requests, on_answer)
    return tokens, time.perf_counter() - started


@contextmanager
def llama_cpp_server(threads: int) -> Iterator[int]:
    """llama.cpp's server on the embedded GGUF with ``threads`` threads, started and stopped as
    ``engine.serve`` starts and stops one (:class:`~snapeval.backends.serve.ServedEngine`); its port."""
    gguf = Path(resolve_pretrained(SPEC.pretrained)) / SPEC.gguf_file
    port = free_port(set())
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--n_ctx", "2048"]
    command += ["--n_threads", str(threads), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--model_alias", "smollm2"]
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "server.log"
        with ServedEngine(command, f"http://127.0.0.1:{port}/v1/models", log, READY_S):
            yield port


def row(backend: str, concurrency: int, tokens: dict, wall: float, reference: dict, inside: float | None):
    generated = sum(len(answer) for answer in tokens.values())
    same = sum(tokens[tag] == reference.get(tag) for tag in tokens)
    return {
        "backend": backend,
        "concurrency": concurrency,
        "answers": len(tokens),
        "tokens": generated,
        "wall s": round(wall, 2),
        "tok/s": round(generated / wall, 1),
        "same as snapeval x1": f"{same}/{len(tokens)}",
        "snapeval outside engine %": "-" if inside is None else round(100 * (wall - inside) / wall, 2),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="passkey prompts (default 8)")
    parser.add_argument("--length", type=int, default=1024, help="prompt tokens (default 1024)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per answer at most")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], help="rows / num_concurrent")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of snapeval's engine")
    parser.add_argument("--server-threads", type=int, default=1, help="llama.cpp threads (--n_threads)")
    args = parser.parse_args(argv)
    positive = ("--prompts", "--max-new-tokens", "--concurrency", "--threads", "--server-threads")
    at_least(args, {**dict.fromkeys(positive, 1), "--length": 256})
    return args


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    tokenizer = load_tokenizer(SPEC)
    model = install(load_model(SPEC))
    requests = passkey_requests(tokenizer, args, frozenset({tokenizer.eos_token_id}))
    rows, reference = [], {}
    for concurrency in args.concurrency:
        batcher = ContinuousBatcher(model, concurrency, "off")
        batcher.reserve(requests)
        tokens, wall = answer_all(batcher, requests)
        reference = reference or tokens
        rows.append(row("snapeval (float32)", concurrency, tokens, wall, reference, None))
    with llama_cpp_server(args.server_threads) as port:
        base_url = f"http://127.0.0.1:{port}/v1/completions"
        for concurrency in args.concurrency:
            arguments = f"base_url={base_url},model=smollm2,num_concurrent={concurrency}"
            client = TimedClient(make_client("local-completions", arguments))
            answerer = LmEvalAnswerer(client, tokenizer, (), concurrency)
            tokens, wall = answer_all(answerer, requests)
            rows.append(row("llama.cpp server (Q4_1)", concurrency, tokens, wall, reference, client.seconds))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"date: {datetime.now().astimezone().isoformat(timespec='seconds')}\n"
        f"machine: {cpu_model()}, {available_cores()} cores, torch {torch.__version__} ({args.threads} "
        f"threads), llama.cpp {args.server_threads} threads, Python {platform.python_version()}; "
        f"load average {load}\n"
        f"prompts: {args.prompts} ruler_passkey at {args.length} tokens, greedy, up to "
        f"{args.max_new_tokens} new tokens; the full cache\n"
    )
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
