"""A deployed engine as a run's answerer: lm-eval's model clients make the calls (``local-completions``
for any OpenAI-compatible server: vLLM, SGLang, TensorRT-LLM, llama.cpp; or ``vllm``, ``sglang``, ...),
with their concurrency, retries and timeouts; snapeval makes the prompts and reads the answers.

A request's prompt is sent as the text of its prompt ids (the same prompt, chat template applied and
fitted to the window, as snapeval's engine gets), greedy or sampled as the run says, cut at the task's
stop strings and at ``max_new_tokens``. Its answer's tokens are the output as the model config's tokenizer
encodes it; what the server's cache held is not known here (``kv_bytes`` is None).

What the server reports of the prompt (``usage.prompt_tokens``, which lm-eval's clients drop) is kept by a
subclass of the client that overrides the one step that sees the server's answer, its
``parse_generations`` (:func:`reporting`): each answer text comes back as a :class:`Reported`, a ``str``
carrying the count, through lm-eval's own ordering of the answers. A server that counts fewer prompt
tokens than were sent cut the prompt without saying so (:attr:`EngineAnswer.truncated`).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from snapeval.backends.faults import Patience, failure_line
from snapeval.configs.backend import client_arguments
from snapeval.decode.continuous import Answer, Request
from snapeval.errors import SnapevalError

FIELD = "model.backend"
ARGUMENTS = "model.backend_args"
TRUNCATION_SLACK = 0.01
"""The share of the prompt tokens sent that a server may count fewer of (its tokenizer's reading of the
prompt's text) before its count says it cut the prompt; at least :data:`TRUNCATION_SLACK_TOKENS`."""
TRUNCATION_SLACK_TOKENS = 2


class Reported(str):
    """An answer's text, as the client returns it, with the prompt tokens its server counted (None where
    the server's answer said none, or counted several prompts together)."""

    prompt_tokens: int | None

    def __new__(cls, text: str, prompt_tokens: int | None) -> Reported:
        made = super().__new__(cls, text)
        made.prompt_tokens = prompt_tokens
        return made


@dataclass
class EngineAnswer(Answer):
    """A deployed engine's answer: an :class:`Answer`, with the prompt tokens its server counted."""

    server_prompt_tokens: int | None = None

    @property
    def truncated(self) -> bool:
        """Whether the server counted fewer prompt tokens than were sent, past :data:`TRUNCATION_SLACK`."""
        if self.server_prompt_tokens is None:
            return False
        sent = len(self.request.prompt_ids)
        slack = max(TRUNCATION_SLACK_TOKENS, int(sent * TRUNCATION_SLACK))
        return self.server_prompt_tokens < sent - slack


def make_client(model: str, arguments: str | None) -> Any:
    """lm-eval's ``model`` client, made from ``arguments`` (``k=v,k=v``) over text prompts; one line on
    ``model.backend`` for a name lm-eval does not know."""
    import lm_eval.models  # noqa: F401  (lm-eval's own clients: a plugin registered first hides them)
    from lm_eval.api.registry import get_model

    try:
        client_class = reporting(get_model(model))
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


def reporting(client_class: type) -> type:
    """``client_class`` where it is one of lm-eval's HTTP clients (a ``TemplateAPI``): a subclass whose
    parse step returns each answer as a :class:`Reported` (snapeval/couplings.py); any other as it is."""
    from lm_eval.models.api_models import TemplateAPI

    if not issubclass(client_class, TemplateAPI):
        return client_class

    class ReportingClient(client_class):  # type: ignore[misc, valid-type]
        def parse_generations(self, outputs: Any, **kwargs: Any) -> list[Any]:
            texts = super().parse_generations(outputs=outputs, **kwargs)
            counts = [
                count
                for answer in (outputs if isinstance(outputs, list) else [outputs])
                for count in prompt_counts(answer)
            ]
            if len(counts) != len(texts):  # a parse step that reads answers otherwise: nothing known
                return texts
            return [
                text if text is None else Reported(text, count)
                for text, count in zip(texts, counts, strict=True)
            ]

    ReportingClient.__name__ = ReportingClient.__qualname__ = f"Reporting{client_class.__name__}"
    return ReportingClient


def prompt_counts(answer: Any) -> list[int | None]:
    """The prompt tokens of each choice of one OpenAI-style answer: its ``usage.prompt_tokens`` where it
    has one choice (a count of several prompts together is no single prompt's)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        return []
    usage = answer.get("usage")
    count = usage.get("prompt_tokens") if isinstance(usage, dict) and len(choices) == 1 else None
    return [count if isinstance(count, int) else None] * len(choices)


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
            print(file=sys.stderr, flush=True)  # ends the line of the client's progress bar, left open
            failure = failure_line(exc, self.patience())
            raise SnapevalError(f"the engine failed to answer: {failure}", FIELD) from None
        seconds = (time.perf_counter() - started) / len(batch)
        return [
            self.answer_of(request, output, seconds) for request, output in zip(batch, outputs, strict=True)
        ]

    def patience(self) -> Patience:
        """The client's tries per call and seconds per try, where it is lm-eval's HTTP client."""
        from lm_eval.models.api_models import TemplateAPI

        if not isinstance(self.client, TemplateAPI):
            return Patience()
        return Patience(self.client.max_retries, self.client.timeout)

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

    def answer_of(self, request: Request, output: str, seconds: float) -> EngineAnswer:
        tokens = self.tokenizer.encode(output or "", add_special_tokens=False)[: request.max_new_tokens]
        stopped = "length" if len(tokens) >= request.max_new_tokens else "stop"
        counted = output.prompt_tokens if isinstance(output, Reported) else None
        return EngineAnswer(
            request,
            tokens,
            stopped,
            prefill_s=0.0,
            decode_s=seconds,
            kv_bytes=None,
            ring_wraps=0,
            kept_histogram=None,
            server_prompt_tokens=counted,
        )
