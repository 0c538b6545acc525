"""Multi-head latent attention (DeepSeek-V3/R1), the paper's own model family, on a tiny random model.

* Selection scores in latent space == a naive reference that decompresses per-head keys with
  ``kv_b_proj`` and scores them in loops (float64); SnapKV and SnapStream keep what that reference keeps;
  the up-projection absorbed is the one the model applies, not its stored weight.
* Under eviction, the batcher and the grid's members (one latent head each) equal each method run alone.
  (A budget holding the prompt is plain transformers on every path: tests/test_family_matrix.py's
  deepseek_v3, the same geometry.)
* A slot holds one latent and one rotary key per layer: bytes per slot are layers x (kv_lora_rank +
  qk_rope_head_dim) x bytes per number (70,272 B for the R1 geometry in bf16), in the batcher and in a
  single-sequence cache alike.
* What cannot work on MLA (re-rotating sink keys, kvpress presses) is one SnapevalError on every path.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from snapeval.cache import build_cache, install
from snapeval.cache.base import SnapevalCache
from snapeval.cache.grid import CacheGrid
from snapeval.cache.method import Selection
from snapeval.cache.scoring import prompt_window_attention
from snapeval.cache.slots import SlotCache
from snapeval.couplings import MLA_LATENT_CACHE, at_least
from snapeval.decode.continuous import ContinuousBatcher, Request
from snapeval.decode.generation import generate, prefill_logits
from snapeval.errors import SnapevalError
from snapeval.results import ResultsDB
from snapeval.run import runner

from .conftest import compose_config
from .families import save_family

LATENT_CACHE = pytest.mark.skipif(
    not at_least(MLA_LATENT_CACHE),
    reason=f"transformers < {MLA_LATENT_CACHE} caches MLA per head; the engine refuses it there "
    "(tests/test_transformers_guard.py)",
)

TOLERANCE = 1e-5
VOCAB = 256
NEW_TOKENS = 12
GEOMETRY = {"kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 12}
EVICTING = [
    {"method": "snapkv", "budget": 48, "window": 8, "kernel": 5},
    {"method": "snapstream", "budget": 64, "window": 8, "kernel": 5, "sinks": 4, "ring": 8},
    {"method": "streaming_llm", "budget": 40, "sinks": 4},
    {"method": "sage_kv", "budget": 48, "sinks": 4, "recent": 8, "window": 4},
    {"method": "speculative_prefill", "budget": 48, "window": 8, "kernel": 5, "chunk": 16},
]


pytestmark = [pytest.mark.usefixtures("one_torch_thread"), LATENT_CACHE]  # tests/conftest.py


def mla_config(**changes) -> DeepseekV3Config:
    """3 layers (one dense, two MoE), q_lora_rank set, interleaved RoPE, v_head_dim apart from the
    key's; weights drawn wide enough (0.2) that attention is far from uniform."""
    settings = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 48,
        **GEOMETRY,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "initializer_range": 0.2,
        "max_position_embeddings": 1024,
    }
    return DeepseekV3Config(**{**settings, **changes})


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    """The tiny model with the snapeval attention."""
    torch.manual_seed(0)
    return install(DeepseekV3ForCausalLM(mla_config()).eval())


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return torch.randint(3, VOCAB, (100,), generator=torch.Generator().manual_seed(1)).tolist()


class Recorder(SnapevalCache):
    """Keeps every layer's prompt as the methods see it, and the whole prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts = []

    def select(self, prompt):
        self.prompts.append(prompt)
        return Selection()


def naive_head_scores(module, query, latent, rotary, window) -> list[list[float]]:
    """Per query head, the causal softmax attention of the last ``window`` queries summed per column,
    against per-head keys [W_UK_h c_j, k_rot_j] decompressed one by one (float64 loops)."""
    heads, length, _ = query.shape
    nope, width = module.qk_nope_head_dim, module.qk_nope_head_dim + module.v_head_dim
    weight = module.kv_b_proj.weight.double()
    scores = []
    for h in range(heads):
        up = weight[h * width : h * width + nope]
        keys = [torch.cat([up @ latent[j].double(), rotary[j].double()]) for j in range(length)]
        summed = [0.0] * length
        for i in range(length - window, length):
            logits = [float(query[h, i].double() @ keys[j]) * module.scaling for j in range(i + 1)]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            for j, w in enumerate(weights):
                summed[j] += w / sum(weights)
        scores.append(summed)
    return scores


def naive_keep(head_scores, window, kernel, keep, sinks=0) -> list[int]:
    """SnapKV(+sinks) on one latent head: each query head's scores max-pooled, all heads averaged, the
    best ``keep`` columns with the window (and sinks) among them."""
    length = len(head_scores[0])
    prefix = length - window
    pooled_heads = [
        [max(scores[max(0, j - kernel // 2) : min(prefix, j + kernel // 2 + 1)]) for j in range(prefix)]
        for scores in head_scores
    ]
    pooled = [sum(head[j] for head in pooled_heads) / len(pooled_heads) for j in range(prefix)]
    forced = set(range(sinks)) | set(range(prefix, length))
    ranked = sorted((j for j in range(prefix) if j not in forced), key=lambda j: (-pooled[j], j))
    return sorted(forced | set(ranked[: keep - len(forced)]))


@torch.no_grad()
def test_latent_scores_and_selections_equal_the_naive_per_head_reference(model, prompt):
    recorder = Recorder()
    prefill_logits(model, prompt, recorder)
    for layer, recorded in enumerate(recorder.prompts):
        module = model.model.layers[layer].self_attn
        assert recorded.cache_heads == 1 and recorded.keys.shape[-1] == GEOMETRY["kv_lora_rank"]
        query, latent, rotary = recorded.query[0], recorded.keys[0, 0], recorded.values[0, 0]
        expected = naive_head_scores(module, query, latent, rotary, window=8)
        got = prompt_window_attention(recorded, 8)[0]
        assert (got.double() - torch.tensor(expected)).abs().max() < TOLERANCE
        snapkv = build_cache({"method": "snapkv", "budget": 40, "window": 8, "kernel": 5})
        assert snapkv.select(recorded).pinned[0, 0].tolist() == naive_keep(expected, 8, 5, keep=40)
        params = {"method": "snapstream", "budget": 56, "window": 8, "kernel": 5, "sinks": 4, "ring": 16}
        pinned = build_cache(params).select(recorded).pinned[0, 0].tolist()
        assert pinned == naive_keep(expected, 8, 5, keep=40, sinks=4)


class StoredApart(torch.nn.Module):
    """A projection whose stored weight is 4x the matrix it applies, as a quantized layer's stored
    blocks differ from what it applies once their scales are in."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(linear.weight.detach() * 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight / 4)


@torch.no_grad()
def test_latent_scores_use_the_up_projection_the_model_applies_not_its_stored_weight(model, prompt):
    torch.manual_seed(0)
    stored_apart = install(DeepseekV3ForCausalLM(mla_config()).eval())
    stored_apart.load_state_dict(model.state_dict())
    for layer in stored_apart.model.layers:
        layer.self_attn.kv_b_proj = StoredApart(layer.self_attn.kv_b_proj)
    expected, got = Recorder(), Recorder()
    prefill_logits(model, prompt, expected)
    prefill_logits(stored_apart, prompt, got)
    for ours, theirs in zip(got.prompts, expected.prompts, strict=True):
        assert (prompt_window_attention(ours, 8) - prompt_window_attention(theirs, 8)).abs().max() < 1e-6


def decode(model, cache, tokens: list[int]) -> torch.Tensor:
    return torch.cat([model(input_ids=torch.tensor([[t]]), past_key_values=cache).logits[0] for t in tokens])


@torch.no_grad()
def test_under_eviction_the_batcher_and_the_grid_equal_each_method_alone(model, prompt):
    requests = [Request(tuple(prompt), params, NEW_TOKENS, tag=i) for i, params in enumerate(EVICTING)]
    got = {}
    ContinuousBatcher(model, rows=3).run(requests, lambda answer: got.__setitem__(answer.request.tag, answer))
    for request in requests:
        alone = generate(model, prompt, build_cache(request.cache), NEW_TOKENS, set())
        assert got[request.tag].tokens == alone.tokens, request.cache
    assert any(answer.ring_wraps > 0 for answer in got.values())
    shared = [params for params in EVICTING if params["method"] != "speculative_prefill"]
    members = [build_cache(params) for params in shared]
    prefill_logits(model, prompt, CacheGrid(members))
    for params, member in zip(shared, members, strict=True):
        alone = build_cache(params)
        prefill_logits(model, prompt, alone)
        for ours, theirs in zip(member.layers, alone.layers, strict=True):
            assert torch.equal(ours.positions, theirs.positions) and torch.equal(ours.keys, theirs.keys)
            assert ours.positions.shape[1] == 1 and (ours.positions[0, 0] >= 0).sum() < len(prompt)
        assert torch.equal(
            decode(model, member, prompt[:NEW_TOKENS]), decode(model, alone, prompt[:NEW_TOKENS])
        )


def test_a_slot_holds_one_latent_and_one_rotary_key_per_layer(model, prompt):
    per_slot = 3 * (GEOMETRY["kv_lora_rank"] + GEOMETRY["qk_rope_head_dim"]) * 4  # layers x widths x fp32
    slots = SlotCache.for_model(model, rows=2, capacity=16)
    assert [tuple(keys.shape) for keys in slots.keys] == [(2, 1, 16, 32)] * 3
    assert [tuple(values.shape) for values in slots.values] == [(2, 1, 16, 8)] * 3
    assert slots.shapes.kv_bytes(1) == per_slot == 480
    cache = build_cache({"method": "snapstream", "budget": 64, "window": 8, "sinks": 4, "ring": 8})
    with torch.no_grad():
        prefill_logits(model, prompt, cache)
    assert cache.kv_bytes() == 64 * per_slot
    got = []
    request = Request(tuple(prompt), {"method": "full"}, 5, tag=0)
    ContinuousBatcher(model, rows=1).run([request], got.append)
    assert got[0].kv_bytes == (len(prompt) + 4) * per_slot


def test_the_r1_geometry_takes_70272_bytes_per_slot_in_bf16():
    """61 layers of kv_lora_rank 512 and qk_rope_head_dim 64 (DeepSeek-R1), all else tiny."""
    config = mla_config(
        num_hidden_layers=61,
        num_attention_heads=1,
        num_key_value_heads=1,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=8,
        v_head_dim=8,
        first_k_dense_replace=61,
        intermediate_size=8,
        hidden_size=32,
    )
    model = install(DeepseekV3ForCausalLM(config).to(torch.bfloat16).eval())
    assert SlotCache.for_model(model, rows=1, capacity=4).shapes.kv_bytes(1) == 61 * (512 + 64) * 2 == 70_272


def fake_kvpress(monkeypatch) -> None:
    class ScorerPress:
        def score(self, *args):
            raise AssertionError("a press must not score an MLA latent")

    monkeypatch.setitem(sys.modules, "kvpress", types.SimpleNamespace(SnapKVPress=ScorerPress))


@pytest.mark.parametrize(
    "params,field",
    [
        ({"method": "streaming_llm", "budget": 40, "sinks": 4, "rerotate": True}, "cache.rerotate"),
        ({"method": "kvpress", "budget": 40}, "cache"),
    ],
    ids=["rerotate", "kvpress"],
)
@torch.no_grad()
def test_what_mla_cannot_do_is_refused_in_one_line_on_every_path(model, prompt, params, field, monkeypatch):
    """model.generate, generate, a grid's shared prefill and the batcher: each before any decode step."""
    fake_kvpress(monkeypatch)
    message = rf"^{field}: deepseek_v3: .*multi-head latent attention"
    paths = [
        lambda: model.generate(torch.tensor([prompt]), past_key_values=build_cache(params), max_new_tokens=3),
        lambda: generate(model, prompt, build_cache(params), 3, set()),
        lambda: prefill_logits(
            model, prompt, CacheGrid([build_cache({"method": "full"}), build_cache(params)])
        ),
        lambda: ContinuousBatcher(model, rows=2).run([Request(tuple(prompt), params, 3)], print),
    ]
    for run in paths:
        with pytest.raises(SnapevalError, match=message):
            run()


@pytest.mark.slow
def test_the_runner_stores_rows_of_a_saved_deepseek_v3_folder(tmp_path):
    """2 passkey rows at 512 tokens: budget 256 stores 256 latent slots per row; a budget holding the
    prompt answers as the full cache does."""
    folder = save_family("deepseek_v3", tmp_path / "deepseek_v3")
    common = [
        f"run.db={tmp_path / 'db.sqlite'}",
        "run.progress=false",
        f"model.pretrained={folder}",
        "run.limit=2",
        "task.context_length=512",
    ]
    runs = [
        ["cache=snapstream", "cache.budget=256"],
        ["cache=full"],
        ["cache=snapstream", "cache.budget=1024"],
    ]
    summaries = [runner.run(compose_config(*common, *run))[0] for run in runs]
    per_slot = 2 * (32 + 8) * 4  # the family's 2 layers x (kv_lora_rank + qk_rope_head_dim) x fp32
    with ResultsDB(tmp_path / "db.sqlite") as db:
        rows = [db.samples_for(summary.config_hash) for summary in summaries]
    assert len(rows[0]) == 2 and all(row["kv_bytes"] == 256 * per_slot for row in rows[0])
    assert [row["output"] for row in rows[1]] == [row["output"] for row in rows[2]]
