"""``snapeval`` (alias ``snapstream``): an lm-eval model that evaluates under a compressed KV cache.

For every request it prefills the context into a fresh snapeval cache (which compresses itself at the
end of that prefill), and only then scores the continuation (``loglikelihood``) or generates
(``generate_until``) against the compressed cache. A hook that compressed after a full forward pass
would leave log-likelihoods unchanged (lm-eval issue 3298); here the continuation never sees what
was evicted.

Model arguments: ``pretrained`` (a snapeval model name, the embedded default if left out, a Hub id, or a
path),
``method`` (any method of :mod:`snapeval.cache.registry`, each a row of ``docs/methods.md``, or
``package.module:ClassName``) and that method's parameters (its class's constructor arguments, e.g.
``budget``, ``ratio``, ``window``, ``sinks``, ``ring``), ``compression`` (query_aware: the whole context is
compressed; query_agnostic: the context up to the last occurrence of ``query_start`` is compressed and the
rest appended after), ``max_length`` (default: the model's window), ``compile`` (the decode step: auto |
off | on | graphs). ``generate_until`` requests go through snapeval's continuous batcher: lm-eval's
``--batch_size`` rows decode together (an integer; ``auto`` means ``run.batch_size``'s default), each
refilled as soon as its answer ends, and identical requests (lm-eval's ``repeats``) share one prefill.
A context becomes a request as the runner's prompts do (:mod:`snapeval.run.requests`), cut in the middle
of its ids when it does not fit; ``compression``, ``compile``, ``dtype`` and ``device`` take what their
config fields take.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm
from transformers import PreTrainedModel

from snapeval.cache import CacheSetting, build_cache, install
from snapeval.configs.compose import default_option
from snapeval.configs.root import declared_default, declared_fields
from snapeval.decode.continuous import Answer, ContinuousBatcher, Request
from snapeval.decode.generation import continuation_logprob
from snapeval.decode.stops import cut_at_stop, stop_ids
from snapeval.errors import SnapevalError
from snapeval.models import attach_drafts, load_model, load_tokenizer, model_spec
from snapeval.run.plan import check_drafts
from snapeval.run.prompting import prompt_ids
from snapeval.run.requests import RequestBuilder, sampling

CONFIG_FIELDS = {
    "compression": "task.compression",
    "batch_size": "run.batch_size",
    "compile": "run.compile",
    "dtype": "model.dtype",
    "device": "model.device",
}
"""The config field whose values each model argument takes (its check is the field's)."""


@register_model("snapeval", "snapstream")  # snapeval.commands.lm_eval_plugin.MODEL_NAMES
class SnapStreamLM(LM):
    """lm-eval model: compress the context at prefill, then score or generate."""

    def __init__(
        self,
        pretrained: str | None = None,
        method: str = "snapstream",
        compression: str = "query_aware",
        query_start: str | None = None,
        max_length: int | None = None,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int | str = declared_default("run.batch_size"),
        compile: str = "auto",
        **cache_parameters: Any,
    ) -> None:
        super().__init__()
        cache_parameters.pop("max_batch_size", None)  # lm-eval's, not the method's
        # a bad choice fails before the model loads; dtype and device may be left to the model's config
        given = {"compression": compression, "compile": compile, "dtype": dtype, "device": device}
        for argument, value in given.items():
            if value is not None or argument in ("compression", "compile"):
                _check(argument, value)
        self.batch_size = _batch_size(batch_size)
        node = {"method": method, **cache_parameters}
        self.setting = CacheSetting.of(node, strict=True)  # before the model loads
        check_drafts([self.setting.stored])  # the run plan's check of the drafts a cache names
        spec = model_spec(pretrained or default_option("model"))
        if device and device.startswith("cuda") and not torch.cuda.is_available():
            logging.getLogger(__name__).warning("no CUDA here: using cpu instead of %s", device)
            device = "cpu"
        overrides = {"device": device, "dtype": dtype}
        spec = type(spec)(**{**spec.__dict__, **{k: v for k, v in overrides.items() if v}})
        self.tokenizer = load_tokenizer(spec)
        self.spec, self.compile = spec, compile
        self.max_length = int(max_length or spec.max_context)
        self.query_start = query_start if compression == "query_agnostic" else None

    @functools.cached_property
    def model(self) -> PreTrainedModel:
        """The weights, loaded at the first request: lm-eval builds the model before it reads the
        tasks' data, so a missing data file is reported before minutes of loading, not after."""
        model = install(load_model(self.spec))
        attach_drafts(model, self.tokenizer, [self.setting.stored])
        return model

    @functools.cached_property
    def builder(self) -> RequestBuilder:
        """How a context becomes a request (:mod:`snapeval.run.requests`), stopping on the runner's stop ids
        (:func:`~snapeval.decode.stops.stop_ids`: they need the model's generation config)."""
        return RequestBuilder(
            self.tokenizer,
            self.max_length,
            stop_ids(self.tokenizer, self.model.generation_config),
            truncation="middle",
            cut_ids=True,  # as LongBench's official pred.py, on the context's ids
            query_start=self.query_start,
        )

    @functools.cached_property
    def batcher(self) -> ContinuousBatcher:
        return ContinuousBatcher(self.model, self.batch_size, self.compile, kv_dtype=self.setting.kv_dtype)

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
        return prompt_ids(self.tokenizer, text)

    def _cache(self):
        return build_cache(self.setting)

    # --- the three request types -----------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results = []
        for request in tqdm(requests, disable=disable_tqdm, desc="loglikelihood"):
            context, continuation = request.args
            stripped = context.rstrip()
            continuation = context[len(stripped) :] + continuation  # whitespace belongs to the continuation
            context_ids, compress_at = self.builder.split(stripped)
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
        """Each request's answer, through the continuous batcher (see the module's docstring).

        Request ``i`` samples from the generation ``seed`` plus ``i``, so answers do not depend on the
        batch size or on which requests share a prefill.
        """
        outputs: list[str] = [""] * len(requests)
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until")

        def on_answer(answer: Answer) -> None:
            index, until = answer.request.tag
            text = self.tokenizer.decode(answer.tokens, skip_special_tokens=True)
            outputs[index] = cut_at_stop(text, until)
            progress.update()

        self.batcher.run([self._request(index, r.args) for index, r in enumerate(requests)], on_answer)
        progress.close()
        return outputs

    def _request(self, index: int, args: tuple[str, dict]) -> Request:
        """Request ``index`` of lm-eval's ``generate_until`` (its context and ``gen_kwargs``): the
        context middle-truncated to leave ``max_gen_toks`` of the window, as LongBench's official pred.py."""
        context, gen_kwargs = args
        until = tuple(s for s in (gen_kwargs.get("until") or []) if s)
        max_new = int(gen_kwargs.get("max_gen_toks", 256))
        draw = sampling(gen_kwargs, int(gen_kwargs.get("seed") or 0) + index)
        return self.builder.request(context, max_new, self.setting, draw, until, (index, until))


def _batch_size(value: int | str) -> int:
    """lm-eval's ``--batch_size``: an integer, or ``auto``/``auto:N`` (``run.batch_size``'s default, with
    a warning: rows are not sized from memory)."""
    if str(value).startswith("auto"):
        rows = declared_default("run.batch_size")
        logging.getLogger(__name__).warning("batch_size=%s is not supported: using %d", value, rows)
        return rows
    try:
        size = int(value)
    except ValueError:
        size = 0
    if (takes := _takes("batch_size", size)) is not None:
        raise SnapevalError(f"must be {takes} or auto, got {value!r}", "batch_size")
    return size


def _check(argument: str, value: Any) -> None:
    """Refuse a model argument's value that its config field would refuse."""
    if (takes := _takes(argument, value)) is not None:
        raise SnapevalError(f"must be {takes}, got {value!r}", argument)


def _takes(argument: str, value: Any) -> str | None:
    """What the config field of ``argument`` takes, when ``value`` is not one of them (else None)."""
    return _field_checks()[CONFIG_FIELDS[argument]](value)


@functools.cache
def _field_checks() -> dict[str, Any]:
    return {path: field.metadata["check"] for path, field in declared_fields()}
