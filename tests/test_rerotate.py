"""StreamingLLM's ``rerotate`` beyond the reference: left padding, and models it must refuse (on a tiny
random-weight Llama, tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from snapeval.cache import StreamingLLMCache, install
from snapeval.cache.attention import ROPE_INV_FREQ, ROPE_ROTATION
from snapeval.errors import SnapevalError

from .conftest import TINY_VOCAB

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(3, TINY_VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def attention_modules(model):
    return [module for module in model.modules() if hasattr(module, "layer_idx")]


def test_left_padded_batch_rerotates_each_row_as_if_alone(tiny_llama):
    model, pad = tiny_llama, 0
    encoded = [prompt(40, seed=1), prompt(25, seed=2)]
    width = max(map(len, encoded))
    input_ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
    attention_mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    budget = 16
    assert min(map(len, encoded)) > budget  # both rows evict, with different gaps

    def generate(input_ids, attention_mask=None):
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=StreamingLLMCache(budget=budget, sinks=4, rerotate=True),
            max_new_tokens=12,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        return torch.stack(output.logits)

    batched = generate(input_ids, attention_mask)
    for row, ids in enumerate(encoded):
        alone = generate(torch.tensor([ids]))[:, 0]
        assert (batched[: len(alone), row] - alone).abs().max().item() < 1e-4


@pytest.mark.parametrize("why", [None, "llama: no RoPE here"], ids=["not_installed", "unreadable"])
def test_rerotate_refuses_a_rotary_embedding_it_cannot_read_before_decoding(tiny_llama, monkeypatch, why):
    for module in attention_modules(tiny_llama):
        monkeypatch.setitem(vars(module), ROPE_ROTATION, why)
    cache = StreamingLLMCache(budget=16, rerotate=True)
    with pytest.raises(SnapevalError) as error, torch.inference_mode():
        tiny_llama(input_ids=torch.tensor([prompt(40, seed=1)]), past_key_values=cache)  # the prefill refuses
    assert error.value.field == "cache.rerotate"
    assert why is None or str(error.value) == f"cache.rerotate: {why}"


def test_install_reads_no_frequencies_that_change_with_the_sequence_length():
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    )
    model = install(LlamaForCausalLM(config))
    assert [getattr(module, ROPE_INV_FREQ) for module in attention_modules(model)] == [None]


def test_rerotate_must_be_a_boolean():
    with pytest.raises(SnapevalError) as error:
        StreamingLLMCache(budget=16, rerotate="yes")
    assert error.value.field == "cache.rerotate"
