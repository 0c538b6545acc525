"""A deployed engine as a run's answerer: lm-eval's model clients make the calls (``local-completions``
for any OpenAI-compatible server: vLLM, SGLang, TensorRT-LLM, llama.cpp; or ``vllm``, ``sglang``, ...),
with their concurrency, retries and timeouts; snapeval makes the prompts and reads the answers.

A request's prompt is sent as the text of its prompt ids (the same prompt, chat template applied and
fitted to the window, as snapeval's engine gets), greedy or sampled as the run says, cut at the task's
stop strings and at ``max_new_tokens``. Its answer's tokens are the output as the model config's tokenizer
encodes it; what the server's cache held is not known here (``kv_bytes`` is None).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from snapeval.configs.backend import client_arguments
from snapeval.decode.continuous import Answer, Request
from snapeval.errors import SnapevalError

FIELD = "model.backend"
ARGUMENTS = "model.backend_args"


def make_client(model: str, arguments: str | None) -> Any:
    """lm-eval's ``model`` client, made from ``arguments`` (``k=v,k=v``) over text prompts; one line on
    ``model.backend`` for a name lm-eval does not know."""
    from lm_eval.api.registry import get_model

    try:
        client_class = get_model(model)
    except ValueError:
        raise SnapevalError(f"lm-eval has no model {model!r} (e.g. local-completions, vllm)", FIELD) from None
    given = ",".join(f"{key}={value}" for key, value in client_arguments(arguments).items())
    try:
        return client_class.create_from_arg_string(given)  # lm-eval's own reading of --model_args
    except Exception as exc:  # an argument the client does not take, or a value it refuses
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise SnapevalError(
            f"lm-eval's {model} refused its arguments ({reason})", "model.backend_args"
        ) from None


class LmEvalAnswerer:
    """Answers requests through an lm-eval client, up to ``rows`` waiting requests per call (the client
    sends them as its ``num_concurrent`` allows)."""

    def __init__(
        self, client: Any, tokenizer: PreTrainedTokenizerBase, stops: Sequence[str], rows: int
    ) -> None:
        self.client, self.tokenizer, self.rows = client, tokenizer, rows
        self.stops = [stop for stop in stops if stop]

    def reserve(self, requests: Iterable[Request]) -> None:
        """Nothing to reserve: the server holds its own memory."""

    def run(
        self,
        requests: Iterable[Request],
        on_answer: Callable[[Answer], Iterable[Request] | None],
        more: Callable[[], Iterable[Request]] | None = None,
        between_steps: Callable[[], None] | None = None,
    ) -> None:
        queue = deque(requests)
        while True:
            if not queue and more is not None:
                queue.extend(more())
            if not queue:
                return
            batch = [queue.popleft() for _ in range(min(self.rows, len(queue)))]
            for answer in self.answer(batch):
                queue.extend(on_answer(answer) or ())

    def answer(self, batch: list[Request]) -> list[Answer]:
        """The answers of ``batch``, in its order, from one call of the client."""
        from lm_eval.api.instance import Instance

        instances = [
            Instance("generate_until", {}, (self.prompt(request), self.generation(request)), index)
            for index, request in enumerate(batch)
        ]
        started = time.perf_counter()
        try:
            outputs = self.client.generate_until(instances, disable_tqdm=True)
        except Exception as exc:  # the client's retries are spent: the server is gone, or refuses
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            failure = f"{type(exc).__name__}: {reason}"
            raise SnapevalError(f"the engine failed to answer ({failure})", FIELD) from None
        seconds = (time.perf_counter() - started) / len(batch)
        return [
            self.answer_of(request, output, seconds) for request, output in zip(batch, outputs, strict=True)
        ]

    def prompt(self, request: Request) -> str:
        """The text the server is sent: the request's prompt ids as text, special tokens kept."""
        return self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)

    def generation(self, request: Request) -> dict[str, Any]:
        """lm-eval's generation arguments of ``request``."""
        sampling = request.sampling
        arguments: dict[str, Any] = {"until": list(self.stops), "max_gen_toks": request.max_new_tokens}
        if sampling.do_sample:
            arguments.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p)
        else:
            arguments.update(do_sample=False, temperature=0.0)
        return arguments

    def answer_of(self, request: Request, output: str, seconds: float) -> Answer:
        tokens = self.tokenizer.encode(output or "", add_special_tokens=False)[: request.max_new_tokens]
        stopped = "length" if len(tokens) >= request.max_new_tokens else "stop"
        return Answer(request, tokens, stopped, 0.0, seconds, None, 0, None)
