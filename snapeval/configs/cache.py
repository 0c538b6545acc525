"""The cache methods' declarations: one dataclass per built-in method, the ``cache`` node of the config.

Each dataclass with a ``label`` is a method's single declaration, a :class:`Method` (what every method
has, declared once): its name (``method``), its ``label`` in figures and tables, its cache's ``shape``
while decoding and its ``source``, the optional ``extra`` it needs, and its parameters (a group that
methods share, such as SnapKV's :class:`Observation`, declared once), their types, defaults and checks
(each field's :func:`~snapeval.configs.fields.setting` check, relations between fields in
:meth:`Method.check_relations` and ``reserved``; one :class:`~snapeval.errors.SnapevalError`
naming ``cache.<field>``). Everything else is derived from it (:mod:`snapeval.configs.methods`): the list
of methods, Hydra's ``cache`` options (``cache=snapstream cache.budget=256``), what results store of a
config, figure labels and styles, the method table of ``docs/methods.md``, and the engine class's name
and label (the engine points at its declaration with ``params_class``). Every method has ``budget`` and
``ratio``, so that one sweep can give a budget to all; a method that takes neither ignores them
(``setting(stored=False)``). Nothing here imports torch: a bad parameter is refused before any model
loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from snapeval.configs.fields import Checked, boolean, choice, json_object, number, odd, setting, slots
from snapeval.configs.footprint import KV_STORAGE
from snapeval.errors import SnapevalError

FULL = "full"
"""The full cache's name: the reference every compressed method is measured against."""
DEFAULT_BUDGET = 1024
"""Slots per layer and KV head of every budgeted method unless a command line says otherwise."""
SELF_DRAFT = "self"
"""The speculative prefill draft that is the target model itself."""


KV_DTYPES = tuple(KV_STORAGE)
"""What ``cache.kv_dtype`` stores keys and values in, besides the model's own dtype (null)."""
DEPLOYMENT = ("prefill_chunk", "kv_dtype")
"""The fields every method takes that describe how it is deployed, not what it keeps."""
POOLINGS = ("max", "avg")
GQA_REDUCTIONS = ("mean", "max")


def ignored() -> Any:
    """A field the method takes no notice of (a sweep may give it to every method): never stored."""
    return setting(None, stored=False, help="ignored by this method")


def draft_name(value: Any) -> str | None:
    """A speculative prefill draft: a model's name, a Hub id, or :data:`SELF_DRAFT`."""
    return None if isinstance(value, str) and value else f"a model name, a Hub id or {SELF_DRAFT!r}"


def check_slot_count(value: Any, field: str, low: int, optional: bool = False) -> None:
    """Refuse ``value`` for ``field`` unless it is a count of slots >= ``low`` (a field checked only in
    some settings of its method)."""
    if (takes := slots(low, optional)(value)) is not None:
        raise SnapevalError(f"must be {takes}, got {value!r}", field)


def check_budget(budget: int | None, ratio: float | None, reserved: int, reserved_what: str) -> None:
    """Exactly one of ``budget`` (slots) or ``ratio`` (kept share of the prompt); budget > reserved."""
    if (budget is None) == (ratio is None):
        raise SnapevalError(
            "give exactly one of cache.budget (slots) or cache.ratio (share kept)", "cache.budget"
        )
    if ratio is not None and (takes := number(0, 1, low_open=True)(ratio)) is not None:
        raise SnapevalError(f"must be {takes}, got {ratio}", "cache.ratio")
    if budget is not None and (not isinstance(budget, int) or budget <= reserved):
        raise SnapevalError(
            f"must be an integer larger than {reserved_what} = {reserved}, got {budget}", "cache.budget"
        )
    check_slot_count(budget, "cache.budget", reserved + 1, optional=True)


def press_arguments(press_args: str) -> dict[str, Any]:
    """A kvpress press's ``press_args``, a JSON object, read; anything else refused in one line."""
    if (takes := json_object(press_args)) is not None:
        raise SnapevalError(f"must be {takes}, got {press_args!r}", "cache.press_args")
    return json.loads(press_args)


@dataclass
class Method(Checked):
    """What every method declares; not a method itself (it has no ``label``). Each method's dataclass
    sets its ``label`` (its name in figures and tables), its cache's ``shape`` while decoding, its
    ``source``, the optional ``extra`` it needs (the dependency and the snapeval extra), and its name,
    ``method``; its own fields follow ``budget`` and ``ratio``, in the order results store them.
    ``prefill_chunk`` and ``kv_dtype`` describe the deployment every method runs in (chunked prefill, KV
    stored in FP8); left null, they are not stored and a setting keeps its hash. ``chunk_refusal`` says
    why a method cannot prefill in chunks (``prefill_chunk`` refused), or None: it can.
    ``reserved`` names the fields whose slots the budget must exceed; such a method takes ``ratio`` instead
    of ``budget``, and sizes its cache as ``ceil(ratio * prompt length)`` (None: the method checks its
    budget itself, or takes none). :meth:`check_relations` checks its other relations between fields,
    after each field's own check and before the budget's."""

    path: ClassVar[str] = "cache"
    label: ClassVar[str]
    shape: ClassVar[str] = "-"
    source: ClassVar[str] = "-"
    extra: ClassVar[str | None] = None
    reserved: ClassVar[tuple[str, ...] | None] = None
    chunk_refusal: ClassVar[str | None] = None
    method: str
    budget: int | None = DEFAULT_BUDGET
    ratio: float | None = None
    prefill_chunk: int | None = setting(
        None, when_set=True, check=slots(optional=True), help="prefill the prompt this many tokens at a time"
    )
    kv_dtype: str | None = setting(
        None, when_set=True, check=choice(*KV_DTYPES, optional=True), help="store keys and values in it"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prefill_chunk is not None and self.chunk_refusal is not None:
            message = f"{self.method} cannot prefill in chunks: {self.chunk_refusal}"
            raise SnapevalError(message, "cache.prefill_chunk")
        self.check_relations()
        if self.reserved is not None:
            slots_reserved = sum(getattr(self, name) for name in self.reserved)
            what = " + ".join(f"cache.{name}" for name in self.reserved)
            check_budget(self.budget, self.ratio, slots_reserved, what)

    def check_relations(self) -> None:
        """Refuse a relation between this method's fields that does not hold (none but the budget's)."""


@dataclass
class Observation:
    """SnapKV's scores: the attention of the last ``window`` prompt queries, pooled with ``kernel`` and
    ``pooling``. A method lists it before :class:`Method` among its bases (``SnapKV(Observation, Method)``),
    so that these fields follow ``budget`` and ``ratio``, before the method's own."""

    window: int = setting(32, check=slots())
    kernel: int = setting(7, check=odd)
    pooling: str = setting("max", check=choice(*POOLINGS))


@dataclass
class Full(Method):
    """Full KV cache: keeps every prompt token and appends every generated one; the reference every
    compressed method is measured against. No parameters (``budget`` and ``ratio`` are ignored)."""

    label = "Full cache"
    shape = "grows"
    method: str = FULL
    budget: int | None = ignored()
    ratio: float | None = ignored()


@dataclass
class StreamingLLM(Method):
    """StreamingLLM (arXiv:2309.17453): the first ``sinks`` tokens and a ring of the most recent
    ``budget - sinks`` tokens, which each generated token advances. ``rerotate`` gives keys their position
    inside the cache, as the original does.
    """

    label = "StreamingLLM"
    shape = "fixed, ring"
    source = "Xiao et al. 2023, arXiv:2309.17453"
    reserved = ("sinks",)
    method: str = "streaming_llm"
    sinks: int = setting(4, check=slots(0))
    rerotate: bool = setting(False, check=boolean)


@dataclass
class SnapKV(Observation, Method):
    """SnapKV (arXiv:2404.14469): at the end of prefill, keep the last ``window`` prompt tokens and the
    ``budget - window`` tokens those queries attend to most (attention pooled with ``kernel``/``pooling``,
    reduced over each GQA group by ``gqa_reduce``); generated tokens are appended.
    """

    label = "SnapKV"
    shape = "grows after prefill"
    source = "Li et al. 2024, arXiv:2404.14469"
    reserved = ("window",)
    method: str = "snapkv"
    gqa_reduce: str = setting("mean", check=choice(*GQA_REDUCTIONS))


@dataclass
class SnapStream(Observation, Method):
    """SnapStream: a fixed cache of ``budget`` slots; ``budget - ring`` hold the prompt (the first
    ``sinks``, the last ``window`` and the best of the rest by SnapKV's scores), the other ``ring`` slots
    a ring of generated tokens that overwrites its oldest.

    ``reselect_every`` (off by default: SnapStream is the paper's method) re-scores instead of dropping:
    whenever the ring is full, its generated tokens are scored by SnapKV's priority from the last ``window``
    generated queries, and the ``reselect_every`` lowest are evicted (the prompt stays pinned).
    """

    label = "SnapStream"
    shape = "fixed, ring"
    source = "SnapStream (SambaNova)"
    reserved = ("window", "sinks", "ring")
    method: str = "snapstream"
    sinks: int = setting(4, check=slots(0))
    ring: int = setting(64, check=slots())
    gqa_reduce: str = setting("mean", check=choice(*GQA_REDUCTIONS))
    reselect_every: int | None = setting(None, when_set=True)

    def check_relations(self) -> None:
        if self.reselect_every is not None and (
            not isinstance(self.reselect_every, int) or not 0 < self.reselect_every < self.ring
        ):
            message = (
                f"must be null or an integer in [1, cache.ring = {self.ring}), got {self.reselect_every!r}"
            )
            raise SnapevalError(message, "cache.reselect_every")


@dataclass
class SageKV(Method):
    """SAGE-KV (arXiv:2503.08879): a fixed cache of ``budget`` slots: the first ``sinks`` tokens, a
    rolling window of the ``recent`` last ones, and the candidates in between that the last ``window``
    prompt queries attend to most, per KV head (query heads reduced by ``gqa_reduce``).
    """

    label = "SAGE-KV"
    shape = "fixed, ring"
    source = "Wang et al. 2025, arXiv:2503.08879"
    reserved = ("sinks", "recent")
    method: str = "sage_kv"
    sinks: int = setting(4, check=slots(0))
    recent: int = setting(64, check=slots())
    window: int = setting(1, check=slots())
    gqa_reduce: str = setting("mean", check=choice(*GQA_REDUCTIONS))


@dataclass
class SpeculativePrefill(Method):
    """Speculative prefill (arXiv:2502.02789): a ``draft`` model (``self``: the target) reads the prompt;
    the target prefills only its last ``window`` tokens and the chunks of ``chunk`` tokens the draft's
    last ``window`` queries attend to most (importance average-pooled with ``kernel``), ``budget`` in all.
    """

    label = "Speculative prefill"
    shape = "grows after prefill"
    source = "Liu et al. 2025, arXiv:2502.02789"
    reserved = ("window",)
    chunk_refusal = "it chooses which prompt tokens to prefill from the whole prompt"
    method: str = "speculative_prefill"
    draft: str = setting(SELF_DRAFT, check=draft_name)
    window: int = setting(8, check=slots())
    kernel: int = setting(13, check=odd)
    chunk: int = setting(32, check=slots())


@dataclass
class RKV(Method):
    """R-KV (arXiv:2505.24133): redundancy-aware compression while decoding, for reasoning traces. A row of
    ``budget + buffer`` slots per layer and KV head; whenever it is full, each layer and KV head keeps
    ``budget`` tokens: the last ``window`` and the best of the rest by ``mix_lambda * importance -
    (1 - mix_lambda) * redundancy``. Importance: the last ``window`` queries' attention logits (max over
    each GQA group), softmax over the other tokens, mean over the window, max-pooled with ``kernel``.
    Redundancy: each token's mean cosine similarity to the held keys (not counting the tokens whose most
    recent look-alike above ``threshold`` it is), softmaxed. A prompt longer than ``budget`` is cut the
    same way.

    The defaults but the budget are the authors' (code and paper). ``ratio`` is ignored.
    """

    label = "R-KV"
    shape = "fixed, re-selected while decoding"
    source = "Cai et al. 2025, arXiv:2505.24133"
    method: str = "rkv"
    ratio: float | None = ignored()
    buffer: int = setting(128, check=slots())
    window: int = setting(8, check=slots())
    kernel: int = setting(7, check=odd)
    mix_lambda: float = setting(0.1, check=number(0, 1))
    threshold: float = setting(0.5, check=number(-1, 1))

    def check_relations(self) -> None:
        if self.buffer < self.window:
            raise SnapevalError(
                f"must be at least cache.window = {self.window}, got {self.buffer}", "cache.buffer"
            )
        if not isinstance(self.budget, int) or self.budget <= self.window:
            message = f"must be an integer larger than cache.window = {self.window}, got {self.budget!r}"
            raise SnapevalError(message, "cache.budget")
        if (too_many := slots()(self.budget)) is not None:
            raise SnapevalError(f"must be {too_many}, got {self.budget}", "cache.budget")


@dataclass
class Kvpress(Method):
    """kvpress (https://github.com/NVIDIA/kvpress): the scorer press ``press`` (a class of ``kvpress``
    with a ``score`` method, made with the JSON object ``press_args``) scores each layer's prompt tokens
    per KV head; the ``budget`` best are kept, or without a budget ``int(L * (1 - compression_ratio))``.

    ``decoding`` also compresses while decoding, as kvpress's ``DecodingPress`` (after a prefill compressed
    to ``budget``: its ``PrefillDecodingPress``): every ``compression_interval`` decode steps each layer is
    scored again (the press reading the attention inputs of the steps since the last compression, at most
    ``hidden_states_buffer_size`` + 1: kvpress's buffer and the step's own) and cut to ``budget``
    (kvpress's ``target_size``), in rows of ``budget + compression_interval`` slots.

    The defaults are kvpress's (``press_args`` {}: the press's own). A ``budget`` replaces the ratio;
    ``ratio`` is ignored.
    """

    label = "kvpress"
    shape = "grows after prefill; `decoding`: fixed, re-selected"
    source = "NVIDIA kvpress (optional extra)"
    extra = "kvpress"
    chunk_refusal = "a press scores a whole prompt's keys and attention inputs at once"
    method: str = "kvpress"
    budget: int | None = None
    ratio: float | None = ignored()
    compression_ratio: float | None = 0.5
    press: str = "SnapKVPress"
    press_args: str = setting("{}", check=json_object)
    decoding: bool = setting(False, when_set=True, check=boolean)
    compression_interval: int | None = setting(512, when_set=True)
    hidden_states_buffer_size: int | None = setting(256, when_set=True)

    def check_relations(self) -> None:
        budget, compression_ratio = self.budget, self.compression_ratio
        if self.decoding:
            check_slot_count(self.compression_interval, "cache.compression_interval", 1)
            check_slot_count(self.hidden_states_buffer_size, "cache.hidden_states_buffer_size", 0)
            if budget is None:
                raise SnapevalError("decoding=true needs a budget (kvpress's target_size)", "cache.budget")
        else:  # what decoding alone reads
            self.compression_interval = self.hidden_states_buffer_size = None
        if budget is not None and (not isinstance(budget, int) or budget <= 0):
            raise SnapevalError(f"must be a positive integer or null, got {budget!r}", "cache.budget")
        check_slot_count(budget, "cache.budget", 1, optional=True)
        ratio_ok = isinstance(compression_ratio, int | float) and 0 <= compression_ratio < 1
        if budget is None and not ratio_ok:
            raise SnapevalError(f"must be in [0, 1), got {compression_ratio!r}", "cache.compression_ratio")
        if budget is not None:
            self.compression_ratio = None  # a budget replaces it
