"""``snapstream``: an lm-eval model that evaluates under a compressed KV cache.

For every request it prefills the context into a fresh snapeval cache (which compresses itself at the
end of that prefill), and only then scores the continuation (``loglikelihood``) or generates
(``generate_until``) against the compressed cache. A hook that compressed after a full forward pass
would leave log-likelihoods unchanged (lm-eval issue 3298); here the continuation never sees what
was evicted.

Model arguments: ``pretrained`` (a snapeval model name such as ``smollm2-135m``, a Hub id, or a path),
``method`` (full | streaming_llm | snapkv | snapstream) and the method's parameters (``budget``,
``ratio``, ``window``, ``kernel``, ``pooling``, ``sinks``, ``ring``, ``gqa_reduce``), ``compression``
(query_aware: the whole context is compressed; query_agnostic: the context up to the last occurrence of
``query_start`` is compressed and the rest appended after), ``max_length`` (default: the model's window),
``draw_batch`` (identical requests, lm-eval's ``repeats``, decoded together after one prefill; default 8);
lm-eval's own ``--batch_size`` left-pads other requests into batches (an integer; ``auto`` means 1).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from snapeval.cache import build_cache, install
from snapeval.errors import SnapevalError
from snapeval.generation import Sampling, continuation_logprob, generate_batch, generate_draws
from snapeval.models import load_model, load_tokenizer, model_spec, pad_token_id
from snapeval.prompting import truncate_middle

CACHE_PARAMETERS = (
    "budget",
    "ratio",
    "window",
    "kernel",
    "pooling",
    "sinks",
    "ring",
    "gqa_reduce",
    "rerotate",
)
COMPRESSIONS = ("query_aware", "query_agnostic")


@register_model("snapstream")
class SnapStreamLM(LM):
    """lm-eval model: compress the context at prefill, then score or generate."""

    def __init__(
        self,
        pretrained: str = "smollm2-135m",
        method: str = "snapstream",
        compression: str = "query_aware",
        query_start: str | None = None,
        max_length: int | None = None,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int | str = 1,
        draw_batch: int = 8,
        **cache_parameters: Any,
    ) -> None:
        super().__init__()
        unknown = sorted(set(cache_parameters) - set(CACHE_PARAMETERS) - {"max_batch_size"})
        if unknown:
            raise SnapevalError(f"unknown model argument(s) {', '.join(unknown)}", "model_args")
        if compression not in COMPRESSIONS:
            raise SnapevalError(f"choose one of {', '.join(COMPRESSIONS)}", "compression")
        if not isinstance(draw_batch, int) or draw_batch <= 0:
            raise SnapevalError(f"must be a positive integer, got {draw_batch!r}", "draw_batch")
        self.draw_batch = draw_batch
        self.batch_size = _batch_size(batch_size)
        self.cache_parameters = {
            "method": method,
            **{k: cache_parameters[k] for k in CACHE_PARAMETERS if k in cache_parameters},
        }
        build_cache(self.cache_parameters)  # bad parameters fail before the model loads
        spec = model_spec(pretrained)
        if device and device.startswith("cuda") and not torch.cuda.is_available():
            logging.getLogger(__name__).warning("no CUDA here: using cpu instead of %s", device)
            device = "cpu"
        overrides = {"device": device, "dtype": dtype}
        spec = type(spec)(**{**spec.__dict__, **{k: v for k, v in overrides.items() if v}})
        self.tokenizer = load_tokenizer(spec)
        self.model = install(load_model(spec))
        self.max_length = int(max_length or spec.max_context)
        self.compression, self.query_start = compression, query_start

    # --- lm-eval's chat-template hooks ------------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # --- helpers ---------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _splits(self, context: str) -> bool:
        """Whether only the part of ``context`` before the query is compressed."""
        return self.compression == "query_agnostic" and bool(self.query_start) and self.query_start in context

    def _split(self, context: str) -> tuple[list[int], int | None]:
        """Context ids and where compression happens: all of it, or up to the query."""
        if self._splits(context):
            cut = context.rfind(self.query_start)
            head = self._encode(context[:cut])
            return head + self._encode(context[cut:]), len(head)
        return self._encode(context), None

    def _cache(self):
        return build_cache(self.cache_parameters)

    # --- the three request types -----------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results = []
        for request in tqdm(requests, disable=disable_tqdm, desc="loglikelihood"):
            context, continuation = request.args
            stripped = context.rstrip()
            continuation = context[len(stripped) :] + continuation  # whitespace belongs to the continuation
            context_ids, compress_at = self._split(stripped)
            whole = self._encode(stripped + continuation)
            continuation_ids = whole[len(self._encode(stripped)) :] or self._encode(continuation)
            if not context_ids:
                context_ids = [self.tokenizer.eos_token_id]
            results.append(
                continuation_logprob(self.model, context_ids, continuation_ids, self._cache(), compress_at)
            )
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        results = []
        for request in tqdm(requests, disable=disable_tqdm, desc="loglikelihood_rolling"):
            ids = self._encode(request.args[0])[-(self.max_length - 1) :]
            logprob, _ = continuation_logprob(self.model, [self.tokenizer.eos_token_id], ids, self._cache())
            results.append(logprob)
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each request's answer, decoded in groups of consecutive requests.

        Identical requests (lm-eval's ``repeats``) are draws of one prompt: they share a prefill and
        decode together, up to ``draw_batch``. Other requests with the same generation settings are
        left-padded into batches of ``batch_size``. Every request samples from its own seed (the
        generation ``seed`` plus its index), so answers do not depend on the grouping.
        """
        outputs: list[str] = []
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until")
        for group in self._groups(requests):
            outputs += self._generate(group, first_index=len(outputs))
            progress.update(len(group))
        progress.close()
        return outputs

    def _groups(self, requests) -> list[list]:
        groups: list[list] = []
        for request in requests:
            last = groups[-1] if groups else []
            draws = bool(last) and all(other.args == request.args for other in last)
            batchable = (
                self.batch_size > 1
                and bool(last)
                and last[0].args[1] == request.args[1]
                and not self._splits(request.args[0])
                and not self._splits(last[0].args[0])
            )
            if (draws and len(last) < self.draw_batch) or (batchable and len(last) < self.batch_size):
                last.append(request)
            else:
                groups.append([request])
        return groups

    def _prompt_ids(self, context: str, max_new: int) -> tuple[list[int], int | None]:
        """The context's ids, middle-truncated to leave ``max_new`` tokens of the window (as LongBench's
        official pred.py), and where compression happens."""
        context_ids, compress_at = self._split(context)
        if len(context_ids) + max_new > self.max_length:
            return truncate_middle(context_ids, self.max_length - max_new), None
        return context_ids, compress_at

    def _generate(self, group: list, first_index: int) -> list[str]:
        gen_kwargs = group[0].args[1]
        until = [s for s in (gen_kwargs.get("until") or []) if s]
        max_new = int(gen_kwargs.get("max_gen_toks", 256))
        samplings = [
            Sampling(
                do_sample=bool(gen_kwargs.get("do_sample", False)),
                temperature=float(gen_kwargs.get("temperature") or 1.0),
                top_p=float(gen_kwargs.get("top_p") or 1.0),
                seed=int(gen_kwargs.get("seed") or 0) + first_index + row,
            )
            for row in range(len(group))
        ]
        stops, should_stop = {self.tokenizer.eos_token_id}, self._stop_check(until)
        if all(request.args == group[0].args for request in group):
            ids, compress_at = self._prompt_ids(group[0].args[0], max_new)
            results = generate_draws(
                self.model, ids, self._cache(), max_new, stops, samplings, compress_at, should_stop
            )
        else:
            prompts = [self._prompt_ids(request.args[0], max_new)[0] for request in group]
            pad = pad_token_id(self.tokenizer)
            results = generate_batch(
                self.model, prompts, self._cache(), max_new, stops, samplings, pad, should_stop
            )
        texts = [self.tokenizer.decode(result.tokens, skip_special_tokens=True) for result in results]
        for stop in until:
            texts = [text.split(stop)[0] for text in texts]
        return texts

    def _stop_check(self, until: list[str]):
        if not until:
            return None
        window = max(len(self._encode(stop)) for stop in until) + 4

        def should_stop(tokens: list[int]) -> bool:
            tail = self.tokenizer.decode(tokens[-window:], skip_special_tokens=True)
            return any(stop in tail for stop in until)

        return should_stop


def _batch_size(value: int | str) -> int:
    """lm-eval's ``--batch_size``: an integer, or ``auto``/``auto:N`` (not supported: 1, with a warning)."""
    if str(value).startswith("auto"):
        logging.getLogger(__name__).warning("batch_size=%s is not supported: using 1", value)
        return 1
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size <= 0:
        raise SnapevalError(f"must be a positive integer or auto, got {value!r}", "batch_size")
    return size
