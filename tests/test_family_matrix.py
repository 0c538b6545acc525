"""Every model family x every method x every path, on tiny random-weight models (tests/families.py).

* A budget holding the prompt == plain transformers (a separately built, unprepared model with the same
  weights and the family's own cache): the same 20 greedy tokens and logits within 1e-5 (fp32), on every
  path: ``model.generate`` with the cache, :func:`snapeval.decode.generation.generate`, the continuous batcher
  with each request alone, and the batcher with every method in rows of one shared prefill (a
  :class:`~snapeval.cache.grid.CacheGrid`), and the query-agnostic split (the last 40 prompt tokens
  appended after compression) on the generator and the batcher. Windowed families (Mistral, Phi-3,
  Gemma 2/3, GPT-OSS) slide their 64-token windows over a 300-token prompt, so a decode mask that
  ignores a window fails here.
* Under eviction every path gives the tokens and logits of the one-by-one generator.
* Re-rotation (StreamingLLM ``rerotate``): keys turned by the engine equal the family's own RoPE at the
  later position (half-split, interleaved and partial rotary); a family it cannot turn is refused with
  the same one line on every path.
* A windowed layer's scores see only its window: a budget above the window keeps all it can still see.
* What the engine cannot serve is refused in one line naming family and feature (layer types it cannot
  cache, models outside transformers' attention interface, softcaps or sinks handed to SDPA).
* bf16: every family runs every method on every path with finite logits.
* (slow) The runner stores rows from saved Mistral, Gemma 3 and GPT-OSS folders, equal to plain
  transformers at a budget holding the prompt.
"""

from __future__ import annotations

import pytest
import torch

from snapeval.cache import build_cache, install
from snapeval.cache.attention import ROPE_ROTATION, ROTARY_MODULE, check_model_config
from snapeval.cache.method import LAYER_WINDOW
from snapeval.cache.rope import KeyRotation
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.generation import generate
from snapeval.errors import SnapevalError
from tests.families import FAMILIES, WINDOW

VOCAB = 512
PROMPT_LENGTH = 300
NEW_TOKENS = 20
TOLERANCE = 1e-5
HOLDING = 512  # a budget holding prompt and answer
QUERY = 40  # prompt tokens appended after compression, where a path splits the prompt
EXACT = {
    "full": {"method": "full"},
    "streaming_llm": {"method": "streaming_llm", "budget": HOLDING},
    "snapkv": {"method": "snapkv", "budget": HOLDING},
    "snapstream": {"method": "snapstream", "budget": HOLDING},
    "sage_kv": {"method": "sage_kv", "budget": HOLDING},
    "speculative_prefill": {"method": "speculative_prefill", "budget": HOLDING, "draft": "self"},
}
EVICTING = {
    "streaming_llm": {"method": "streaming_llm", "budget": 96, "sinks": 4},
    "streaming_llm_rerotate": {"method": "streaming_llm", "budget": 96, "sinks": 4, "rerotate": True},
    "snapkv": {"method": "snapkv", "budget": 96, "window": 8, "kernel": 5},
    "snapstream": {"method": "snapstream", "budget": 128, "window": 8, "kernel": 5, "sinks": 4, "ring": 12},
    "sage_kv": {"method": "sage_kv", "budget": 96, "sinks": 4, "recent": 12, "window": 2},
    "speculative_prefill": {"method": "speculative_prefill", "budget": 128, "window": 8, "chunk": 16},
}
NOT_REROTATED = {"deepseek_v3"}  # MLA caches its rotary key apart from the keys: refused
WINDOWED = {"mistral", "phi3", "gemma2", "gemma3", "gpt_oss"}
ALL_LAYERS_WINDOWED = {"mistral", "phi3"}


class LogitTap:
    """Records every output of the model's LM head (logits before any final softcap), to compare paths."""

    def __init__(self, model):
        self.outputs: list[torch.Tensor] = []
        self.handle = model.get_output_embeddings().register_forward_hook(self._record)

    def _record(self, module, args, output):
        self.outputs.append(output[:, -1].detach().float().clone())

    def take(self) -> list[torch.Tensor]:
        outputs, self.outputs = self.outputs, []
        return outputs


def build(name: str, dtype: torch.dtype = torch.float32):
    model = FAMILIES[name](VOCAB).to(dtype)
    model.generation_config.eos_token_id = None  # random weights: always 20 tokens
    return model


def prompt(seed: int = 1) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (PROMPT_LENGTH,), generator=generator).tolist()


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    """(name, installed model, its logit tap, prompt, plain transformers' tokens and logits)."""
    name, ids = request.param, prompt()
    plain = build(name)
    tap = LogitTap(plain)
    with torch.inference_mode():
        output = plain.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    reference = (output[0, PROMPT_LENGTH:].tolist(), torch.cat(tap.take()))
    model = install(build(name))
    return name, model, LogitTap(model), ids, reference


def run_paths(model, tap, ids, settings: dict[str, dict]) -> dict[tuple[str, str], tuple[list, torch.Tensor]]:
    """(method, path) -> (20 tokens, (20 or 19, vocab) logits) for every setting on every path."""
    runs = {}
    for method, params in settings.items():
        if plain_prefill_differs(params):
            runs.update(unplain_paths(model, tap, ids, method, params))
            continue
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]),
                past_key_values=build_cache(params),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
        runs[method, "model.generate"] = (out[0, len(ids) :].tolist(), torch.cat(tap.take()[-NEW_TOKENS:]))
        runs.update(unplain_paths(model, tap, ids, method, params))
    requests = [Request(tuple(ids), params, NEW_TOKENS, tag=i) for i, params in enumerate(settings.values())]
    got = {}
    ContinuousBatcher(model, len(requests)).run(requests, lambda a: got.__setitem__(a.request.tag, a))
    steps = [logits for logits in tap.take() if logits.shape[0] == len(requests)]
    for index, method in enumerate(settings):  # each setting in the row of its class that it decoded in
        decoded = torch.stack([step[got[index].row] for step in steps])
        runs[method, "batcher rows, shared prefill"] = (got[index].tokens, decoded)
    return runs


def plain_prefill_differs(params: dict) -> bool:
    """Speculative prefill chooses what to prefill in snapeval's prefill; ``model.generate`` prefills the
    whole prompt (documented in its class), so under eviction that path is another algorithm."""
    return params["method"] == "speculative_prefill" and params["budget"] < PROMPT_LENGTH


def unplain_paths(model, tap, ids, method, params, compress_at=None):
    """generation.generate and the batcher alone; with ``compress_at`` the prompt's tail (a query) is
    appended after compression, in one multi-token call that the windowed decode mask covers too."""
    suffix = "" if compress_at is None else ", query appended"
    tokens = generate(model, ids, build_cache(params), NEW_TOKENS, set(), compress_at=compress_at).tokens
    runs = {(method, "generation.generate" + suffix): (tokens, torch.cat(tap.take()[-NEW_TOKENS:]))}
    answers = batch(model, [Request(tuple(ids), params, NEW_TOKENS, compress_at=compress_at)])
    runs[method, "batcher" + suffix] = (answers[0], torch.cat(tap.take()[-NEW_TOKENS:]))
    return runs


def batch(model, requests: list[Request]) -> list[list[int]]:
    got = {}
    ContinuousBatcher(model, len(requests)).run(requests, lambda a: got.__setitem__(a.request.tag, a.tokens))
    return [got[request.tag] for request in requests]


def assert_same(runs, tokens, logits, what):
    for (method, path), (got_tokens, got_logits) in runs.items():
        assert got_tokens == tokens, f"{what}: {method} on {path} generated other tokens"
        expected = logits[-got_logits.shape[0] :]
        error = (got_logits - expected).abs().max().item()
        assert error <= TOLERANCE, f"{what}: {method} on {path}: logits differ by {error:.2e}"


def test_budget_holding_the_prompt_equals_plain_transformers_on_every_path(family):
    name, model, tap, ids, (tokens, logits) = family
    assert len(tokens) == NEW_TOKENS and logits.shape[0] == NEW_TOKENS
    runs = run_paths(model, tap, ids, EXACT)
    for method, params in EXACT.items():
        runs.update(unplain_paths(model, tap, ids, method, params, compress_at=PROMPT_LENGTH - QUERY))
    assert len(runs) == 6 * len(EXACT)
    assert_same(runs, tokens, logits, name)


def test_under_eviction_every_path_equals_the_one_by_one_generator(family):
    name, model, tap, ids, (_, full_logits) = family
    settings = {k: v for k, v in EVICTING.items() if not (name in NOT_REROTATED and v.get("rerotate"))}
    runs = run_paths(model, tap, ids, settings)
    for method in settings:
        tokens, logits = runs[method, "generation.generate"]
        assert_same({key: run for key, run in runs.items() if key[0] == method}, tokens, logits, name)
    if name not in ALL_LAYERS_WINDOWED:  # there, what a window of 64 sees is kept by every method
        changes = [(runs[method, "generation.generate"][1] - full_logits).abs().max() for method in settings]
        assert max(changes) > 1e-3, "nothing evicted?"


def test_rerotated_keys_equal_the_familys_own_rope_at_the_later_position(family):
    name, model, _, ids, _ = family
    attentions = [module for module in model.modules() if hasattr(module, ROPE_ROTATION)]
    attentions = [module for module in attentions if hasattr(module, "head_dim")] or attentions[:1]
    for attention in attentions:  # every layer: Gemma 3's local and global layers have their own bases
        rotation = getattr(attention, ROPE_ROTATION)
        if name in NOT_REROTATED:
            assert isinstance(rotation, str) and rotation.startswith(model.config.model_type)
            continue
        assert isinstance(rotation, KeyRotation)
        assert rotation.interleaved == (name == "cohere")
        assert_turns_like_the_familys_rope(attention, rotation)
    if name == "gemma3":  # local and global layers turn keys by their own RoPE bases
        assert len({tuple(getattr(a, ROPE_ROTATION).inv_freq.tolist()) for a in attentions}) == 2


def assert_turns_like_the_familys_rope(attention, rotation):
    rotary = getattr(attention, ROTARY_MODULE)
    apply = __import__(type(attention).__module__, fromlist=["x"]).apply_rotary_pos_emb
    layer_type = getattr(attention, "layer_type", None)
    per_type = {"layer_type": layer_type} if hasattr(rotary, f"{layer_type}_inv_freq") else {}
    generator = torch.Generator().manual_seed(5)
    raw = torch.randn(2, 2, 3, attention.head_dim, generator=generator)  # (batch, kv_heads, n, d)
    start = torch.tensor([[5, 40, 41], [0, 7, 300]])
    offset = torch.tensor([[3, 100], [17, 1]])  # per row and KV head

    def at(positions):  # the family's own RoPE of ``raw`` at (batch, kv_heads, n) positions
        out = torch.empty_like(raw)
        for head in range(2):
            cos, sin = rotary(raw, positions[:, head], **per_type)
            out[:, head : head + 1] = apply(raw[:, head : head + 1], raw[:, head : head + 1], cos, sin)[1]
        return out

    later = start[:, None, :] + offset[..., None]
    turned = rotation.rotate(at(start[:, None, :].expand(2, 2, 3)), offset)
    assert (turned - at(later)).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", sorted(NOT_REROTATED))
def test_rerotation_is_refused_in_one_line_on_every_path_where_it_cannot_be_done(name):
    model, ids = install(build(name)), prompt()
    params = EVICTING["streaming_llm_rerotate"]
    messages = []
    for run in (
        lambda: generate(model, ids, build_cache(params), 2, set()),
        lambda: model.generate(torch.tensor([ids]), past_key_values=build_cache(params), max_new_tokens=2),
        lambda: batch(model, [Request(tuple(ids), params, 2)]),
    ):
        with pytest.raises(SnapevalError) as error:
            run()
        assert error.value.field == "cache.rerotate"
        messages.append(str(error.value))
    assert len(set(messages)) == 1
    assert messages[0].startswith(f"cache.rerotate: {model.config.model_type}: ")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bf16_runs_every_method_on_every_path_with_finite_logits(name):
    model = install(build(name, torch.bfloat16))
    tap = LogitTap(model)
    settings = {key: value for key, value in EVICTING.items() if key != "streaming_llm_rerotate"}
    ids = prompt(2)[:200]
    for params in settings.values():
        generate(model, ids, build_cache(params), 4, set())
    batch(model, [Request(tuple(ids), params, 4, tag=i) for i, params in enumerate(settings.values())])
    outputs = tap.take()
    assert outputs and all(bool(torch.isfinite(logits).all()) for logits in outputs)


def layer_windows(model) -> dict[int, int | None]:
    """Each attention layer's sliding window (None: full attention) as its prefill passed it."""
    with torch.inference_mode():
        model(torch.tensor([prompt()[:16]]), past_key_values=build_cache({"method": "full"}))
    return {
        module.layer_idx: vars(module)[LAYER_WINDOW]
        for module in model.modules()
        if LAYER_WINDOW in vars(module) and hasattr(module, "head_dim")
    }


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_windows_are_shorter_than_prompt_and_answer(name):
    """A window of 64 tokens over the 300-token prompt: on every layer of a family whose config has no
    ``layer_types`` (Mistral, Phi-3: the window is the whole model's), on the sliding layers (beside full
    ones) of the others."""
    model = install(build(name))
    config = model.config
    assert config.sliding_window == WINDOW < PROMPT_LENGTH
    layer_types = getattr(config, "layer_types", None)
    windows = layer_windows(model)
    assert sorted(windows) == list(range(config.num_hidden_layers))
    if name in ALL_LAYERS_WINDOWED:
        assert layer_types is None and set(windows.values()) == {WINDOW}
    else:
        assert set(layer_types) == {"sliding_attention", "full_attention"}
        expected = {i: WINDOW if kind == "sliding_attention" else None for i, kind in enumerate(layer_types)}
        assert windows == expected


def test_a_layer_type_the_engine_cannot_cache_is_refused_naming_family_and_feature():
    config = FAMILIES["qwen2"](VOCAB).config
    config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(SnapevalError) as error:
        check_model_config(config)
    assert error.value.field == "model"
    assert str(error.value).startswith("model: qwen2: linear_attention layers are not supported")


def test_a_family_outside_transformers_attention_interface_is_refused_naming_it():
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=4)
    with pytest.raises(SnapevalError) as error:
        install(MambaForCausalLM(config))
    assert str(error.value).startswith("model: mamba: MambaForCausalLM does not route attention")


@pytest.mark.parametrize("name", ["mistral", "gemma3", "gpt_oss"])
def test_a_windowed_layer_scores_only_inside_its_window(name):
    """SnapKV with a budget above the window keeps every prompt token a windowed layer can still see:
    its scores come from the layer's own (windowed) attention, so nothing outside outranks them."""
    model, ids = install(build(name)), prompt()
    cache = build_cache({"method": "snapkv", "budget": 96, "window": 8, "kernel": 5})
    with torch.inference_mode():
        model(torch.tensor([ids]), past_key_values=cache)
    windows = layer_windows(model)
    windowed = [layer for layer, window in windows.items() if window is not None]
    assert windowed and all(windows[layer] == WINDOW for layer in windowed)
    visible = set(range(PROMPT_LENGTH - WINDOW + 1, PROMPT_LENGTH))  # what the next query still sees
    for layer in windowed:
        for head in cache.kept_positions(layer)[0].tolist():
            assert visible <= set(head), f"{name} layer {layer} evicted tokens inside its window"


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_softcap_and_sinks_never_reach_an_attention_that_drops_them(name):
    model = build(name)
    assert model.config._attn_implementation == "eager"  # transformers' choice, and load_model's
    model.config._attn_implementation = "sdpa"
    install(model)
    with pytest.raises(SnapevalError) as error, torch.inference_mode():
        model(torch.tensor([prompt()[:20]]), past_key_values=build_cache({"method": "full"}))
    assert str(error.value).startswith(f"model: {name}: SDPA would drop")


RUNNER_FAMILIES = ["mistral", "gemma3", "gpt_oss"]


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNER_FAMILIES)
def test_runner_stores_rows_from_a_saved_family_folder_equal_to_plain_transformers(name, tmp_path):
    """``python -m snapeval model.pretrained=<folder> cache=snapstream ...`` on a saved random model: an
    evicting budget stores its rows; a budget holding the prompt stores plain transformers' answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from snapeval.models import encode_chat
    from snapeval.results import load
    from snapeval.run import runner
    from snapeval.tasks import load_task
    from tests.conftest import compose_config
    from tests.families import save_family

    folder = save_family(name, tmp_path / name)
    common = [
        f"run.db={tmp_path / 'db.sqlite'}",
        "run.progress=false",
        f"model.pretrained={folder}",
        f"model.name=random-{name}",
        "cache=snapstream",
        "run.limit=2",
        "task.context_length=512",
        "task.max_new_tokens=12",
    ]
    [evicting] = runner.run(compose_config(*common, "cache.budget=256"))
    assert evicting.n == 2 and evicting.computed == 2
    cfg = compose_config(*common, "cache.budget=4096")
    [holding] = runner.run(cfg)
    stored = load(tmp_path / "db.sqlite")
    assert len(stored) == 4
    rows = stored[stored["config_hash"] == holding.config_hash].sort_values("sample_id")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    plain = AutoModelForCausalLM.from_pretrained(folder).eval()
    prompts = sorted(load_task(cfg["task"], cfg["seed"]).prompts(tokenizer)[:2], key=lambda p: p.id)
    for prompt, output in zip(prompts, rows["output"], strict=True):
        ids = torch.tensor([encode_chat(tokenizer, prompt.messages)])
        with torch.inference_mode():
            answer = plain.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
        assert tokenizer.decode(answer, skip_special_tokens=True) == output
