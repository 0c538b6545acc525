"""LiveCodeBench prompts are lcb_runner's for the model's style, byte for byte
(tests/data/lcb_prompts.json, recorded by running ``format_prompt_generation``), chosen from the model's
config and overridable; a raw prompt reaches the model as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from snapeval.configs.compose import compose_config
from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR
from snapeval.run.prompting import encode_with_split, fit_to_window
from snapeval.tasks import load_task
from snapeval.tasks.base import RAW_ROLE
from snapeval.tasks.livecodebench.prompts import STYLES, build_messages

RECORDED = json.loads((Path(__file__).parent / "data" / "lcb_prompts.json").read_text(encoding="utf-8"))
CASES = RECORDED["cases"]


def as_recorded(messages: list[dict[str, str]]) -> str | list[dict[str, str]]:
    """lcb_runner's form: one string for a raw prompt, else the chat messages."""
    return messages[0]["content"] if messages[0]["role"] == RAW_ROLE else messages


def test_every_shipped_style_is_recorded() -> None:
    assert all(set(case["prompts"]) == set(STYLES) for case in CASES)
    assert {"openai_chat", "llama3", "codeqwen", "deepseek_r1"} <= set(STYLES)
    assert {bool(case["starter_code"]) for case in CASES} == {True, False}


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("case", CASES, ids=[case["case"] for case in CASES])
def test_prompts_are_lcb_runners_byte_for_byte(style: str, case: dict) -> None:
    assert as_recorded(build_messages(case, style)) == case["prompts"][style]


@pytest.mark.parametrize(
    ("model", "style"),
    [
        ("deepseek-r1-distill-qwen-7b", "deepseek_r1"),
        ("qwen2.5-7b-instruct", "codeqwen"),
        ("llama-3.1-8b-instruct", "llama3"),
        ("smollm2-135m", "openai_chat"),
    ],
)
def test_the_style_is_the_models(model: str, style: str) -> None:
    task_cfg = compose_config("task=livecodebench", f"model={model}")["task"]
    assert task_cfg["prompt_style"] == style  # stored with the task config, so part of its hash
    task = load_task(task_cfg, seed=0)
    assert as_recorded(task.messages(CASES[0])) == CASES[0]["prompts"][style]


def test_every_model_config_names_a_shipped_style() -> None:
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        assert compose_config(f"model={path.stem}")["model"]["prompt_style"] in STYLES, path.name


def test_the_style_is_overridable_and_checked() -> None:
    for override in ("model.prompt_style=openai_chat", "task.prompt_style=openai_chat"):
        config = compose_config("task=livecodebench", "model=deepseek-r1-distill-qwen-7b", override)
        assert config["task"]["prompt_style"] == "openai_chat"
    with pytest.raises(SnapevalError, match="task.prompt_style"):
        load_task(compose_config("task=livecodebench", "task.prompt_style=gpt")["task"], seed=0)


def word_tokenizer(bos: bool) -> PreTrainedTokenizerFast:
    """A tokenizer that splits on spaces and, like Llama-3's, may add a BOS of its own."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "a": 2, "b": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", unk_token="<unk>")


@pytest.mark.parametrize(("bos", "ids"), [(True, [1, 1, 2, 3]), (False, [1, 2, 3])])
def test_a_raw_prompt_is_tokenized_as_vllm_tokenizes_text(bos: bool, ids: list[int]) -> None:
    """No chat template; the tokenizer's own special tokens added, as vLLM does for lcb_runner's string
    prompts (so a BOS in the text and a BOS-adding tokenizer give two)."""
    tokenizer = word_tokenizer(bos)
    messages = [{"role": RAW_ROLE, "content": "<s> a b"}]
    assert encode_with_split(tokenizer, messages, None) == (ids, None)
    assert fit_to_window(tokenizer, messages, 4, "error") == messages
    with pytest.raises(SnapevalError, match="task.truncation"):
        fit_to_window(tokenizer, messages, len(ids) - 1, "error")


def test_the_schema_offers_exactly_the_shipped_styles() -> None:
    from snapeval.configs.fields import PROMPT_STYLES

    assert list(PROMPT_STYLES) == list(STYLES)
