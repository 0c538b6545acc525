"""The memory estimator against hand-computed KV-cache and weights sizes of real models."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from transformers import GPT2Config, LlamaConfig, Qwen2Config

from snapeval.errors import SnapevalError
from snapeval.memory import (
    catalogue,
    estimate,
    geometry_from_config,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    load_geometry,
    load_hardware,
    method_names,
    model_names,
    shipped_configs,
)
from snapeval.memory.cli import main
from snapeval.memory.parameters import estimate_parameters
from snapeval.memory.units import format_bytes, parse_size
from snapeval.paths import CONF_DIR

GIB = 2**30
CONTEXT_128K = 131_072

LLAMA_8B_PER_TOKEN = 2 * 32 * 8 * 128 * 2
DEEPSEEK_PER_TOKEN = 61 * (512 + 64) * 2
SMOLLM2_FP32_PER_TOKEN = 2 * 30 * 3 * 64 * 4
PER_LAYER_TOKEN_BF16 = 2 * 2 * 64 * 2  # small_config: K and V, 2 heads of 64 dims, 2 bytes


def small_config(**overrides: object) -> dict[str, object]:
    """A 4-layer Llama-style config.json: 8 heads, 2 KV heads of 64 dims."""
    config = {
        "model_type": "llama",
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    return {**config, **overrides}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "snapeval.memory", *args], capture_output=True, text=True, env=env, timeout=120
    )


# --- KV bytes of the built-in models -----------------------------------------------------------


def test_llama_8b_bf16_is_128_kib_per_token_and_16_gib_at_128k():
    geometry = load_geometry("llama-3.1-8b-instruct")
    assert kv_bytes_per_token(geometry, "bf16") == LLAMA_8B_PER_TOKEN == 131_072
    assert kv_bytes_per_sequence(geometry, CONTEXT_128K, "bf16") == 16 * GIB
    assert geometry.attention == "gqa"


@pytest.mark.parametrize("name", ["deepseek-r1", "deepseek-v3"])
def test_deepseek_mla_caches_the_latent_and_rope_key(name):
    geometry = load_geometry(name)
    assert geometry.attention == "mla"
    assert kv_bytes_per_token(geometry, "bf16") == DEEPSEEK_PER_TOKEN == 70_272
    sequence = kv_bytes_per_sequence(geometry, CONTEXT_128K, "bf16")
    assert sequence == 70_272 * CONTEXT_128K
    assert format_bytes(sequence) == "8.58 GiB"


def test_smollm2_fp32_per_token():
    geometry = load_geometry("smollm2-135m")
    assert (geometry.num_layers, geometry.num_kv_heads, geometry.head_dim) == (30, 3, 64)
    assert kv_bytes_per_token(geometry, "fp32") == SMOLLM2_FP32_PER_TOKEN == 46_080


@pytest.mark.parametrize(("kv_dtype", "expected"), [("fp16", 131_072), ("fp8", 65_536), ("int8", 65_536)])
def test_kv_dtype_sets_bytes_per_element(kv_dtype, expected):
    assert kv_bytes_per_token(load_geometry("llama-3.1-8b-instruct"), kv_dtype) == expected


def test_qwen25_sliding_window_is_off_in_its_config():
    geometry = load_geometry("qwen2.5-7b-instruct")
    assert geometry.num_sliding_layers == 0
    assert kv_bytes_per_token(geometry, "bf16") == 2 * 28 * 4 * 128 * 2


@pytest.mark.parametrize(
    ("hub_id", "tolerance"),
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", 0),
        ("meta-llama/Llama-3.1-8B-Instruct", 0),
        ("meta-llama/Llama-3.1-70B-Instruct", 0),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", 0),
        ("Qwen/Qwen2.5-7B-Instruct", 1e-4),  # Qwen2's q/k/v biases are not in its config
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 1e-4),
        ("Qwen/Qwen3-8B", 1e-5),  # q/k norms are not counted
        ("openai/gpt-oss-20b", 1e-3),  # nor attention sinks and biases
        ("google/gemma-3-12b-it", 0.04),  # the published total holds the vision tower
        ("deepseek-ai/DeepSeek-R1", 1e-4),  # the published count is rounded to 671B
    ],
)
def test_parameter_estimate_matches_the_published_count(hub_id, tolerance):
    config = json.loads(shipped_configs()[hub_id].read_text())
    fields = config.get("text_config", config)
    assert estimate_parameters(fields) == pytest.approx(config["_num_parameters"], rel=tolerance, abs=0)


def test_deepseek_v2_lite_parameters_are_estimated_at_its_published_15_7b():
    geometry = load_geometry("deepseek-v2-lite-chat")
    assert geometry.parameters_estimated
    assert round(geometry.num_parameters / 1e8) == 157


# --- one catalogue: conf/model names, shipped geometry, Hub ids, local configs -----------------


@pytest.mark.parametrize("name", model_names())
def test_every_conf_model_name_resolves_offline_to_its_hub_config(name, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("fetched from the Hub")

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", no_network)
    entry = yaml.safe_load((CONF_DIR / "model" / f"{name}.yaml").read_text())
    geometry = load_geometry(name)
    assert geometry.name == name
    assert geometry.source == entry.get("hub_id", entry["pretrained"])
    assert geometry.source in shipped_configs()


@pytest.mark.parametrize(
    ("name", "per_token", "mib_at_32k"),
    [
        ("llama-3.1-8b-instruct", 2 * 32 * 8 * 128 * 2, 4096),
        ("deepseek-r1-distill-llama-8b", 2 * 32 * 8 * 128 * 2, 4096),
        ("llama-3.1-70b-instruct", 2 * 80 * 8 * 128 * 2, 10_240),
        ("qwen2.5-7b-instruct", 2 * 28 * 4 * 128 * 2, 1792),
        ("deepseek-r1-distill-qwen-7b", 2 * 28 * 4 * 128 * 2, 1792),  # its 4,096 window is switched off
        ("qwen3-8b", 2 * 36 * 8 * 128 * 2, 4608),
        ("deepseek-v2-lite-chat", 27 * (512 + 64) * 2, 972),
        ("deepseek-r1", DEEPSEEK_PER_TOKEN, 70_272 * 32_768 / 2**20),
        ("deepseek-v3", DEEPSEEK_PER_TOKEN, 70_272 * 32_768 / 2**20),
        # 8 global layers hold 32k tokens, 40 sliding layers their 1,024; 16 KB a token and layer
        ("gemma-3-12b-it", 48 * 2 * 8 * 256 * 2, (8 * 32_768 + 40 * 1024) * 2 * 8 * 256 * 2 / 2**20),
        # 12 full layers hold 32k tokens, 12 sliding layers their 128
        ("gpt-oss-20b", 24 * 2 * 8 * 64 * 2, (12 * 32_768 + 12 * 128) * 2 * 8 * 64 * 2 / 2**20),
    ],
)
def test_conf_model_bytes_per_token_and_at_32k(name, per_token, mib_at_32k):
    result = estimate(name, "h100", context=32_768)
    assert result.kv_bytes_per_token == per_token
    assert result.kv_bytes_per_sequence_full / 2**20 == mib_at_32k


def test_sliding_layers_hold_the_smaller_of_window_and_budget():
    per_layer = 2 * 8 * 256 * 2  # gemma-3-12b: bytes of one token in one layer
    wide = estimate("gemma-3-12b-it", "h100", context=32_768, budget=4096)
    assert wide.kv_bytes_per_sequence_compressed == (8 * 4096 + 40 * 1024) * per_layer
    narrow = estimate("gemma-3-12b-it", "h100", context=32_768, budget=512)
    assert narrow.kv_bytes_per_sequence_compressed == 48 * 512 * per_layer
    short = estimate("gemma-3-12b-it", "h100", context=600)
    assert short.kv_bytes_per_sequence_full == 48 * 600 * per_layer
    assert any("40 of 48 layers use sliding-window attention" in note for note in wide.notes)


def test_a_shipped_hub_id_is_read_offline_and_named_as_given(monkeypatch):
    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", None)  # calling it would fail
    geometry = load_geometry("Qwen/Qwen3-8B")
    assert (geometry.name, geometry.num_layers, geometry.num_kv_heads) == ("Qwen/Qwen3-8B", 36, 8)


def test_any_other_hub_id_is_fetched(monkeypatch):
    fetched = []

    def from_pretrained(repo_id):
        fetched.append(repo_id)
        return LlamaConfig(**{k: v for k, v in small_config().items() if k != "model_type"})

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", from_pretrained)
    geometry = load_geometry("someone/tiny-llama")
    assert fetched == ["someone/tiny-llama"]
    assert (geometry.name, geometry.source, geometry.num_layers) == (
        "someone/tiny-llama",
        "someone/tiny-llama",
        4,
    )


def test_a_conf_model_entry_with_a_local_folder_reads_its_config(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(small_config(num_hidden_layers=3)))
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "mine.yaml").write_text(f"name: mine\npretrained: {tmp_path / 'model'}\n")
    monkeypatch.setattr(catalogue, "MODEL_CONF_DIR", tmp_path / "conf")
    geometry = load_geometry("mine")
    assert (geometry.name, geometry.num_layers) == ("mine", 3)
    assert geometry.source == str(tmp_path / "model" / "config.json")


def test_a_conf_model_entry_loaded_from_a_package_must_name_its_hub_id(tmp_path, monkeypatch):
    (tmp_path / "packaged.yaml").write_text("name: packaged\npretrained: pkg://some_package\n")
    monkeypatch.setattr(catalogue, "MODEL_CONF_DIR", tmp_path)
    with pytest.raises(
        SnapevalError, match="loads pkg://some_package: name the Hub id of its config in hub_id"
    ):
        load_geometry("packaged")


def test_every_shipped_config_names_its_hub_ids_and_none_twice():
    files = {path.name for path in shipped_configs().values()}
    assert len(files) == len(list(catalogue.SHIPPED_DIR.glob("*.json")))  # no file ships nothing


# --- estimate: compression, tensor parallelism, memory tiers ------------------------------------


def test_budget_32k_at_128k_context_is_a_4x_reduction():
    result = estimate("deepseek-r1", "sn40l", context=CONTEXT_128K, tp=16, budget=32_768)
    assert result.method == "snapstream"
    assert result.tokens_compressed == 32_768
    assert result.kv_bytes_per_sequence_compressed == DEEPSEEK_PER_TOKEN * 32_768
    assert result.reduction == 4.0


def test_mla_latent_is_replicated_per_socket_unless_sharded():
    result = estimate("deepseek-r1", "sn40l", context=CONTEXT_128K, tp=16, budget=32_768)
    assert result.kv_bytes_per_token_per_socket == DEEPSEEK_PER_TOKEN
    assert result.kv_replication == 16
    assert any("replicated" in note for note in result.notes)

    sharded = dataclasses.replace(load_hardware("sn40l"), mla_latent_sharded=True)
    result = estimate("deepseek-r1", sharded, context=CONTEXT_128K, tp=16, budget=32_768)
    assert result.kv_bytes_per_token_per_socket == 61 * (576 // 16) * 2


def test_tp_16_over_8_kv_heads_replicates_heads():
    result = estimate("llama-3.1-8b-instruct", "sn40l", context=CONTEXT_128K, tp=16)
    per_socket = 2 * 32 * 1 * 128 * 2  # ceil(8 / 16) = 1 KV head on each socket
    assert result.kv_bytes_per_token_per_socket == per_socket
    assert result.kv_bytes_per_sequence_full_per_socket == per_socket * CONTEXT_128K == 2 * GIB
    assert result.kv_replication == 2.0
    assert any("replicated" in note and "ceil(8/16) = 1" in note for note in result.notes)


def test_tp_that_divides_the_kv_heads_splits_them():
    result = estimate("llama-3.1-70b-instruct", "h100", context=CONTEXT_128K, tp=8)
    assert result.kv_bytes_per_token_per_socket == 2 * 80 * 1 * 128 * 2
    assert result.kv_replication == 1.0
    assert not any("replicated" in note for note in result.notes)


def test_llama_8b_on_one_h100_fits_three_full_128k_sequences():
    result = estimate("llama-3.1-8b-instruct", "h100", context=CONTEXT_128K)
    hbm = next(tier for tier in result.tiers if tier.name == "hbm")
    assert result.weights_bytes_per_socket == 8_030_261_248 * 2
    assert hbm.kv_available == 80 * 10**9 - 8_030_261_248 * 2
    assert (hbm.fits_full, hbm.max_sequences_full) == (True, 3)
    assert [tier.name for tier in result.tiers] == ["onchip", "hbm"]


DEEPSEEK_WHOLE = 61 * 187_107_328 + 58 * 7168 * 256 + 123 * 7168
"""Parameters every rank holds whole under DeepSeek-V3's TP plan: its MLA attention (61 layers), the
routers of its 58 MoE layers and its norms; the rest (671B in all) is split."""


def test_deepseek_bf16_weights_overflow_hbm_into_ddr_at_tp16():
    result = estimate(
        "deepseek-r1", "sn40l", context=CONTEXT_128K, tp=16, budget=32_768, weights_dtype="bf16"
    )
    tiers = {tier.name: tier for tier in result.tiers}
    weights = DEEPSEEK_WHOLE * 2 + (671 * 10**9 - DEEPSEEK_WHOLE) * 2 // 16
    assert result.weights_bytes_per_socket == weights
    assert tiers["hbm"].kv_available == 0
    assert tiers["ddr"].kv_available == 1_500 * 10**9 - (weights - 64 * 10**9)
    assert tiers["ddr"].max_sequences_compressed == tiers["ddr"].kv_available // (DEEPSEEK_PER_TOKEN * 32_768)
    assert tiers["onchip"].kv_available == 260 * 10**6
    assert any("overflow HBM into DDR" in note for note in result.notes)


def test_fp8_deepseek_weights_leave_hbm_for_kv():
    """The weights in the dtype DeepSeek-R1's checkpoint stores them: FP8 (its quantization_config)."""
    result = estimate("deepseek-r1", "sn40l", context=CONTEXT_128K, tp=16, budget=32_768)
    assert result.weights_dtype == "fp8"
    hbm = next(tier for tier in result.tiers if tier.name == "hbm")
    assert hbm.kv_available == 64 * 10**9 - (DEEPSEEK_WHOLE + (671 * 10**9 - DEEPSEEK_WHOLE) // 16)
    assert hbm.max_sequences_full == hbm.kv_available // (DEEPSEEK_PER_TOKEN * CONTEXT_128K) == 1
    assert hbm.max_sequences_compressed == hbm.kv_available // (DEEPSEEK_PER_TOKEN * 32_768) == 4


def test_snapstream_preallocates_its_budget_but_snapkv_keeps_at_most_the_context():
    snapstream = estimate("smollm2-135m", "sn40l", context=512, budget=1024)
    snapkv = estimate("smollm2-135m", "sn40l", context=512, budget=1024, method="snapkv")
    assert snapstream.tokens_compressed == 1024
    assert snapkv.tokens_compressed == 512
    assert snapkv.reduction == 1.0


def test_every_budgeted_method_holds_what_its_cache_class_allocates():
    holds = {
        method: estimate("smollm2-135m", "sn40l", context=512, budget=256, method=method).tokens_compressed
        for method in method_names()
        if method not in ("full", "kvpress")  # kvpress needs its extra: tests/test_kvpress.py
    }
    assert holds == {
        "rkv": 256 + 128,  # its rows hold the buffer that fills between re-selections too
        "sage_kv": 256,
        "snapkv": 256,
        "snapstream": 256,
        "speculative_prefill": 256,
        "streaming_llm": 256,
    }
    short = estimate("smollm2-135m", "sn40l", context=200, budget=256, method="streaming_llm")
    assert short.tokens_compressed == 256  # a fixed-capacity buffer: allocated whole whatever the context


def test_batch_working_set_decides_fit():
    result = estimate("llama-3.1-8b-instruct", "h100", context=CONTEXT_128K, batch=4)
    hbm = next(tier for tier in result.tiers if tier.name == "hbm")
    assert hbm.max_sequences_full == 3 and not hbm.fits_full


def test_as_row_is_flat_with_a_column_set_per_tier():
    rows = [
        estimate("deepseek-r1", "sn40l", context=CONTEXT_128K, tp=16, budget=32_768).as_row(),
        estimate("llama-3.1-8b-instruct", "h100", context=CONTEXT_128K).as_row(),
    ]
    frame = pd.DataFrame(rows)
    assert list(frame["reduction"]) == [4.0, 1.0]
    assert frame.loc[0, "ddr_max_sequences_compressed"] > 0
    assert rows[1]["ddr_capacity"] is None
    assert all(not isinstance(value, (dict, list, tuple)) for row in rows for value in row.values())


# --- configs: transformers objects, sliding windows, bad fields ----------------------------------


def test_transformers_config_gives_the_builtin_geometry():
    config = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    )
    geometry = geometry_from_config(config)
    assert kv_bytes_per_token(geometry, "fp32") == SMOLLM2_FP32_PER_TOKEN
    assert geometry.parameters_estimated
    assert geometry.num_parameters == load_geometry("smollm2-135m").num_parameters


def test_transformers_attribute_map_and_nested_text_config():
    gpt2 = geometry_from_config(GPT2Config(n_layer=6, n_head=4, n_embd=256), num_parameters=1)
    assert (gpt2.num_layers, gpt2.num_kv_heads, gpt2.head_dim, gpt2.attention) == (6, 4, 64, "mha")
    nested = geometry_from_config({"model_type": "llava", "text_config": small_config()})
    assert nested.num_layers == 4


def test_layer_types_cap_only_the_sliding_layers():
    config = small_config(
        sliding_window=4096,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )
    geometry = geometry_from_config(config)
    assert (geometry.sliding_window, geometry.num_sliding_layers) == (4096, 2)
    assert kv_bytes_per_token(geometry, "bf16") == 4 * PER_LAYER_TOKEN_BF16
    expected = (2 * 32_768 + 2 * 4096) * PER_LAYER_TOKEN_BF16
    assert kv_bytes_per_sequence(geometry, 32_768, "bf16") == expected
    assert kv_bytes_per_sequence(geometry, 1000, "bf16") == 4 * 1000 * PER_LAYER_TOKEN_BF16


def test_sliding_window_without_layer_types_caps_every_layer():
    geometry = geometry_from_config(small_config(sliding_window=4096))
    assert kv_bytes_per_sequence(geometry, 32_768, "bf16") == 4 * 4096 * PER_LAYER_TOKEN_BF16


def test_qwen2_use_sliding_window_caps_layers_from_max_window_layers():
    fields = {"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 1}
    from_dict = geometry_from_config(small_config(**fields))
    from_transformers = geometry_from_config(
        Qwen2Config(**{k: v for k, v in small_config(**fields).items() if k != "model_type"})
    )
    assert from_dict.num_sliding_layers == from_transformers.num_sliding_layers == 3
    assert kv_bytes_per_sequence(from_dict, 32_768, "bf16") == kv_bytes_per_sequence(
        from_transformers, 32_768, "bf16"
    )
    off = geometry_from_config(small_config(**{**fields, "use_sliding_window": False}))
    assert off.num_sliding_layers == 0


def test_sliding_window_pattern_keeps_every_nth_layer_global():
    geometry = geometry_from_config(
        small_config(num_hidden_layers=12, sliding_window=1024, sliding_window_pattern=6)
    )
    assert geometry.num_sliding_layers == 10


def test_config_json_without_num_hidden_layers_names_the_field(tmp_path):
    config = small_config()
    del config["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SnapevalError, match="num_hidden_layers") as caught:
        load_geometry(str(tmp_path))
    assert caught.value.field == "num_hidden_layers"


def test_local_config_json_loads_by_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_config(head_dim=32)))
    geometry = load_geometry(str(path))
    assert geometry.head_dim == 32 and geometry.source == str(path)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (small_config(num_attention_heads=0), "num_attention_heads"),
        (small_config(kv_lora_rank=512), "qk_rope_head_dim"),
        (small_config(sliding_window=128, layer_types=["full_attention"]), "layer_types"),
    ],
)
def test_bad_config_fields_are_named(config, field):
    with pytest.raises(SnapevalError) as caught:
        geometry_from_config(config)
    assert caught.value.field == field


def test_unknown_names_list_the_choices():
    with pytest.raises(SnapevalError, match="deepseek-r1, .*llama-3.1-8b-instruct, .*smollm2-135m"):
        load_geometry("gpt-5")
    with pytest.raises(SnapevalError, match="h100, h200, sn40l"):
        load_hardware("tpu-v5")


def test_unknown_dtype_names_the_setting():
    with pytest.raises(SnapevalError) as caught:
        kv_bytes_per_token(load_geometry("llama-3.1-8b-instruct"), "fp4")
    assert caught.value.field == "kv_dtype"


# --- hardware profiles ------------------------------------------------------------------------


def test_sn40l_profile_holds_the_published_capacities():
    profile = load_hardware("sn40l")
    capacities = {tier.name: tier.capacity for tier in profile.tiers}
    assert capacities == {"onchip": 520 * 10**6, "hbm": 64 * 10**9, "ddr": 1_500 * 10**9}
    assert (profile.sockets_per_node, profile.onchip_kv_fraction, profile.mla_latent_sharded) == (
        8,
        0.5,
        False,
    )


def test_gpu_profiles_have_no_ddr_tier():
    assert load_hardware("h200").tier("hbm").capacity == 141 * 10**9
    assert load_hardware("h100").tier("onchip").capacity == 50 * 10**6
    assert load_hardware("h100").tier("ddr") is None


@pytest.mark.parametrize(
    ("text", "size"), [("520 MB", 520 * 10**6), ("1.5 TB", 1_500 * 10**9), ("64GiB", 64 * GIB)]
)
def test_parse_size(text, size):
    assert parse_size(text, "capacity") == size


def test_parse_size_rejects_unitless_numbers():
    with pytest.raises(SnapevalError, match="capacity"):
        parse_size("64", "capacity")


# --- command line -----------------------------------------------------------------------------


def test_cli_prints_the_deepseek_sn40l_table(capsys):
    assert main(["model=deepseek-r1", "hardware=sn40l", "context=131072", "tp=16", "budget=32768"]) == 0
    out = capsys.readouterr().out
    for expected in ("70,272 B", "8.58 GiB", "2.14 GiB", "4.00x", "on-chip SRAM (PMU)", "DDR", "replicated"):
        assert expected in out


def test_cli_prints_the_llama_h100_table(capsys):
    assert main(["model=llama-3.1-8b-instruct", "hardware=h100", "context=131072"]) == 0
    out = capsys.readouterr().out
    assert "131,072 B (128.00 KiB)" in out and "16.00 GiB" in out and "HBM3" in out


def test_cli_reports_replication(capsys):
    assert main(["model=llama-3.1-8b-instruct", "hardware=sn40l", "context=131072", "tp=16"]) == 0
    out = capsys.readouterr().out
    assert "16,384 B" in out and "tp=16 does not divide the 8 KV heads" in out


def test_cli_takes_a_conf_model_name_and_defaults_to_sn40l(capsys):
    assert main(["model=deepseek-r1-distill-qwen-7b", "context=32768"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("deepseek-r1-distill-qwen-7b (GQA, 7.62B parameters) on sn40l: context 32,768")
    assert "57,344 B (56.00 KiB)" in out and "1.75 GiB" in out


def test_cli_entry_point_runs():
    result = run_cli("model=llama-3.1-8b-instruct", "hardware=h100", "context=131072")
    assert result.returncode == 0, result.stderr
    assert "131,072 B (128.00 KiB)" in result.stdout and "16.00 GiB" in result.stdout


LLAMA_H100 = ("model=llama-3.1-8b-instruct", "hardware=h100")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["model=gpt-5", "hardware=sn40l", "context=1"], "unknown model 'gpt-5'; choose one of"),
        (
            ["model=llama-3.1-8b-instruct", "hardware=tpu", "context=1"],
            "unknown hardware 'tpu'; choose one of",
        ),
        (
            [*LLAMA_H100, "context=0"],
            "context: must be a positive integer",
        ),
        (
            [*LLAMA_H100, "context=-8"],
            "context: must be a positive integer",
        ),
        (
            [*LLAMA_H100, "context=1", "batch=0"],
            "batch: must be a positive integer",
        ),
        (
            [*LLAMA_H100, "context=1", "kv_dtype=fp4"],
            "kv_dtype: unknown dtype",
        ),
        (
            [*LLAMA_H100, "context=1", "frobnicate=1"],
            "unknown key 'frobnicate'",
        ),
        (list(LLAMA_H100), "missing context="),
        (["hardware=h100", "context=1"], "missing model="),
    ],
)
def test_cli_bad_input_is_one_error_line_and_exit_2(args, message, capsys):
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1
    assert message in err


def test_cli_command_without_the_hub_is_one_error_line_and_exit_2():
    """A real ``python -m snapeval.memory`` with the Hub offline: a Hub id it must fetch."""
    result = run_cli("model=mistralai/Mistral-7B-Instruct-v0.3", "context=1")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "Hub is unreachable" in result.stderr


def test_cli_names_the_missing_config_field(tmp_path, capsys):
    config = small_config()
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main([f"model={path}", "hardware=h100", "context=1024"]) == 2
    assert capsys.readouterr().err == "error: num_hidden_layers: missing from the model config\n"


# --- the README's memory section ----------------------------------------------------------------

ESTIMATOR_PAGE = (CONF_DIR.parent / "docs" / "memory.md").read_text()  # the estimator's page


@pytest.mark.parametrize(
    "arguments", re.findall(r"^python -m snapeval\.memory (.+?)(?:\s+#.*)?$", ESTIMATOR_PAGE, re.M)
)
def test_readme_memory_command_runs(arguments, capsys):
    assert main(shlex.split(arguments)) == 0
    assert capsys.readouterr().out


def test_readme_memory_table_is_the_estimate():
    rows = re.findall(r"^\| (`.+?) \| .+? \| ([\d,]+) B \| ([\d,]+) MiB \|$", ESTIMATOR_PAGE, re.M)
    assert len(rows) == 9
    for names, per_token, mib in rows:
        for name in re.findall(r"`([^`]+)`", names):
            result = estimate(name, "h100", context=32_768)
            assert f"{result.kv_bytes_per_token:,}" == per_token, name
            assert f"{round(result.kv_bytes_per_sequence_full / 2**20):,}" == mib, name
