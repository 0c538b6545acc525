"""The paper's model family under tensor parallel (issue 55): MLA and mixtures of experts on transformers'
own plans, on tiny random models saved to folders, 2 gloo ranks against one process.

* DeepSeek-V3 (MLA, routed and shared experts), Qwen3-MoE and Mixtral split by their TP plans, and the
  four MoE families (GPT-OSS too) with their experts placed by the expert-parallel plan
  (``model.tp_style=ep``): every method (the one-by-one generator, the batcher, every method in rows of
  one shared prefill, R-KV re-selecting while decoding, sampled decoding) answers token for token as one
  process, logits within 1e-5 of the largest, on both ranks.
* The kept positions gathered from every rank, after the prefill's selection and after decoding (R-KV's
  re-selections), are the one process's: under MLA every rank holds the whole latent and keeps the same
  positions; where the plan splits KV heads, the ranks' heads side by side are the one process's heads.
* ``torchrun --nproc-per-node 2 -m snapeval model=deepseek-v3 model.pretrained=<folder> ...`` stores the
  one process's samples with its TP degree; so do Qwen3-MoE and GPT-OSS.
* Expert parallel is refused in one line where transformers cannot make it (from the config alone).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from snapeval.cli.world import World
from snapeval.couplings import MOE_TENSOR_PARALLEL, at_least
from snapeval.errors import SnapevalError
from snapeval.memory import geometry_from_config, shipped_configs
from snapeval.memory.catalogue import shipped_config
from snapeval.memory.parameters import parameter_groups
from snapeval.memory.sharding import whole_on_every_rank
from snapeval.models.parallel import check_tensor_parallel, tp_load_arguments
from tests import tensor_parallel_worker as worker
from tests.families import FAMILIES, _build, save_family
from tests.test_tensor_parallel import (
    assert_answers_alike,
    assert_same_samples,
    saved,
    split_runs,
    stored_runs,
)

SPLIT = pytest.mark.skipif(
    not at_least(MOE_TENSOR_PARALLEL), reason=f"transformers < {MOE_TENSOR_PARALLEL} refuses MoE under TP"
)
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
TIMEOUT_S = 1200  # four families on 2 ranks of a loaded 2-core machine


def mixtral(vocab: int) -> torch.nn.Module:
    """4 experts, 2 per token, GQA (4 query and 2 KV heads)."""
    return _build("MixtralConfig", "MixtralForCausalLM", vocab, head_dim=16, num_local_experts=4)


TP_FAMILIES = {"deepseek_v3": FAMILIES["deepseek_v3"], "qwen3_moe": FAMILIES["qwen3_moe"], "mixtral": mixtral}
"""Split by their TP plans (GPT-OSS's, splitting its embeddings alone: tests/test_tensor_parallel.py)."""
EP_FAMILIES = {**TP_FAMILIES, "gpt_oss": FAMILIES["gpt_oss"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(one process's results, {"tp": [rank 0's, rank 1's], "ep": [...]}) of the worker on every family."""
    root = tmp_path_factory.mktemp("moe")
    folders = saved(root, EP_FAMILIES)
    tp_folders = [folder for folder in folders if folder.name in TP_FAMILIES]
    single, [tp] = split_runs(root / "tp", tp_folders, [()], TIMEOUT_S)
    _, [ep] = split_runs(root / "ep", folders, [("--style=ep",)], TIMEOUT_S)
    return worker.main(str(root / "tp1"), [str(folder) for folder in folders]), {"tp": tp, "ep": ep}


def launches(family: str) -> list[str]:
    return ["tp", "ep"] if family in TP_FAMILIES else ["ep"]


def methods_of(family: str) -> int:
    """The worker's methods run on ``family``: all but re-rotated sinks under MLA."""
    return len(worker.SETTINGS) - (family == "deepseek_v3")


@SPLIT
@pytest.mark.slow  # .ci/run runs it
@pytest.mark.parametrize("family", list(EP_FAMILIES))
def test_every_method_answers_under_tp_and_ep_as_one_process_on_every_rank(runs, family):
    single, split = runs
    keys = [key for key in single["runs"] if key[0] == family]
    assert len(keys) == 2 * methods_of(family) + 3
    for style in launches(family):
        assert_answers_alike(single["runs"], [rank["runs"] for rank in split[style]], keys)


@SPLIT
@pytest.mark.slow  # .ci/run runs it
@pytest.mark.parametrize("family", list(EP_FAMILIES))
def test_the_kept_positions_gathered_from_every_rank_are_the_one_process_s(runs, family):
    """After the prefill and after decoding, for every method: under MLA (DeepSeek-V3) and GPT-OSS every
    rank holds every KV head and the same positions; where the plan splits KV heads, rank 0's heads then
    rank 1's are the one process's."""
    single, split = runs
    methods = [method for fam, method in single["kept"] if fam == family]
    assert len(methods) == methods_of(family)
    whole = family in ("deepseek_v3", "gpt_oss")
    for style in launches(family):
        for method in methods:
            expected = single["kept"][family, method]
            first, second = (rank["kept"][family, method] for rank in split[style])
            if whole:
                assert first == expected and second == expected, (style, family, method)
            else:
                for held, mine, theirs in zip(expected, first, second, strict=True):
                    gathered = [a + b for a, b in zip(mine, theirs, strict=True)]
                    assert gathered == held, (style, family, method)
    prompt = worker.PROMPT_LENGTH
    prefill, decoded = (
        [sorted(p for p in layer[0] if 0 <= p < prompt) for layer in held]
        for held in single["kept"][family, "rkv"]
    )
    assert prefill != decoded  # R-KV re-selected prompt positions while decoding: a real re-selection


@SPLIT
@pytest.mark.slow  # .ci/run runs it
@pytest.mark.parametrize(
    ("family", "model", "share"),
    [("deepseek_v3", "deepseek-v3", 1), ("qwen3_moe", None, 2), ("gpt_oss", "gpt-oss-20b", 1)],
)
def test_a_tp2_run_of_a_saved_moe_folder_stores_the_rows_of_one_process(tmp_path, family, model, share):
    """``torchrun --nproc-per-node 2 -m snapeval model=deepseek-v3 model.pretrained=<folder>
    model.max_context=4096 cache=snapstream cache.budget=128``: the one process's samples, TP degree 2;
    a rank stores the whole row's KV bytes and its share: the whole latent (MLA), every KV head
    (GPT-OSS's plan keeps attention whole), or half of Qwen3-MoE's 2 KV heads."""
    folder = save_family(family, tmp_path / family)
    named = [f"model={model}"] if model else ["model.name=random-qwen3-moe"]
    overrides = [*named, f"model.pretrained={folder}", "model.max_context=4096", "cache=snapstream"]
    overrides += ["cache.budget=128", "run.limit=2", "task.context_length=512", "run.progress=false"]
    stored, _ = stored_runs(overrides, tmp_path, TIMEOUT_S)
    assert_same_samples(stored)
    assert [whole for whole, _ in stored["tp2"][2]] == [whole for whole, _ in stored["tp1"][2]]
    assert [share * part for whole, part in stored["tp2"][2]] == [whole for whole, _ in stored["tp2"][2]]


def test_expert_parallel_is_refused_in_one_line_where_transformers_cannot_make_it():
    qwen3_moe = transformers.Qwen3MoeConfig(num_attention_heads=4, num_key_value_heads=2)  # 128 experts
    if not at_least(MOE_TENSOR_PARALLEL):
        with pytest.raises(
            SnapevalError, match=r"^model\.tp: qwen3_moe: tensor parallel over its 128 experts"
        ):
            check_tensor_parallel(qwen3_moe, 2, "ep")
        return
    check_tensor_parallel(qwen3_moe, 2, "ep")
    check_tensor_parallel(transformers.DeepseekV3Config(), 8, "ep")
    with pytest.raises(SnapevalError, match=r"^model\.tp_style: llama has no experts to place across ranks"):
        check_tensor_parallel(transformers.LlamaConfig(), 2, "ep")
    with pytest.raises(SnapevalError, match=r"^model\.tp_style: qwen3_moe: 3 ranks cannot hold equal shares"):
        check_tensor_parallel(
            transformers.Qwen3MoeConfig(num_attention_heads=6, num_key_value_heads=3), 3, "ep"
        )
    llama4 = transformers.Llama4TextConfig(num_attention_heads=4, num_key_value_heads=2, num_local_experts=4)
    with pytest.raises(
        SnapevalError, match=r"^model\.tp_style: llama4_text: transformers .* no expert-parallel"
    ):
        check_tensor_parallel(llama4, 2, "ep")
    ep = tp_load_arguments(World(2, 0, 0), "ep")["distributed_config"]
    assert (ep.tp_plan, ep.ep_size, ep.tp_size) == ("auto", 2, 2)
    assert tp_load_arguments(World(), "ep") == {}


PLAN_RULES = {
    "attention": (".self_attn.",),
    "mlp": (".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj"),
    "experts": (".mlp.experts",),
    "shared_experts": (".shared_expert",),
}
"""A part of a model is split when a rule of its family's plan names it."""


@pytest.mark.skipif(not at_least(MOE_TENSOR_PARALLEL), reason="the estimator writes down 5.24's plans")
def test_the_estimators_parts_whole_on_every_rank_are_transformers_plans():
    """For every model the estimator ships and the MoE families, the parts it holds whole on every rank are
    those with parameters that no rule of the family's TP plan splits (routers and norms never are)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    shipped = (shipped_config(source) for source in shipped_configs())
    configs = [{**config, **config.get("text_config", {})} for config in shipped]  # Gemma 3's text model
    configs += [
        FAMILIES[name](worker.VOCAB).config.to_dict() for name in ("qwen3_moe", "deepseek_v3", "gpt_oss")
    ]
    configs += [mixtral(worker.VOCAB).config.to_dict(), transformers.Qwen2MoeConfig().to_dict()]
    assert {"deepseek_v3", "deepseek_v2", "gpt_oss", "qwen2_moe", "llama"} <= {
        c["model_type"] for c in configs
    }
    for config in configs:
        plan = dict(getattr(CONFIG_MAPPING[config["model_type"]], "base_model_tp_plan", None) or {})
        split = {part for part, words in PLAN_RULES.items() if any(w in rule for rule in plan for w in words)}
        parts = parameter_groups(config)
        expected = (
            {p: n for p, n in parts.items() if n and p in PLAN_RULES and p not in split} if plan else {}
        )
        expected |= {part: parts[part] for part in ("routers", "norms") if parts[part]}
        assert whole_on_every_rank(config) == expected, config["model_type"]


def test_the_parts_every_rank_holds_whole_are_the_models_own():
    """The estimator's parts of the tiny DeepSeek-V3 that its TP plan leaves whole on every rank (MLA
    attention, routers, norms) count the parameters of those modules of the built model."""
    model = FAMILIES["deepseek_v3"](worker.VOCAB)
    counted = {"attention": 0, "routers": 0, "norms": 0}
    for name, parameter in model.named_parameters():
        part = "attention" if ".self_attn." in name else "routers" if ".mlp.gate." in name else None
        part = part or ("norms" if name.endswith("norm.weight") else None)
        if part:
            counted[part] += parameter.numel()
    assert dict(geometry_from_config(model.config).replicated) == counted
