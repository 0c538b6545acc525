"""LiveCodeBench's code-generation prompts per model style, as lcb_runner's ``format_prompt_generation``
builds them for its ``LMStyle`` (``lcb_runner/prompts/code_generation.py``).

The styles are :data:`~snapeval.configs.fields.PROMPT_STYLES`; the prompt of a style is this module's
``_<style>``. A style gives either chat messages (the model's chat template comes around them) or one
finished prompt text, special tokens included, that the model reads as it is (a
:data:`~snapeval.tasks.base.RAW_ROLE` message). The style is the model's (``model.prompt_style`` in
``conf/model/<name>.yaml``, as lcb_runner's model list assigns it), overridable per run
(``model.prompt_style=...`` or ``task.prompt_style=...``):

===============  ========================  ===================================================
style            lcb_runner ``LMStyle``    prompt
===============  ========================  ===================================================
``openai_chat``  ``OpenAIChat``            system + user messages, the model's chat template
``llama3``       ``LLaMa3``                those messages in Meta-Llama-3-8B-Instruct's template
``codeqwen``     ``CodeQwenInstruct``      ChatML text (Qwen2.5 instruct models)
``qwq``          ``QwQ``                   ChatML text with QwQ's system prompt
``deepseek_r1``  ``DeepSeekR1``            DeepSeek-R1 text (the R1 distills)
===============  ========================  ===================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from snapeval.configs.fields import PROMPT_STYLES
from snapeval.tasks.base import RAW_ROLE

SYSTEM_MESSAGE = (
    "You are an expert Python programmer. You will be given a question (problem specification) "
    "and will generate a correct Python program that matches the specification and passes all tests."
)
FORMAT_WITH_STARTER_CODE = (
    "You will use the following starter code to write the solution to the problem "
    "and enclose your code within delimiters."
)
FORMAT_WITHOUT_STARTER_CODE = (
    "Read the inputs from stdin solve the problem and write the answer to stdout "
    "(do not directly test on the sample inputs). Enclose your code within delimiters as follows. "
    "Ensure that when the python program runs, it reads the inputs, runs the algorithm "
    "and writes output to STDOUT."
)
_TASK = (
    "You will be given a question (problem specification) and will generate a correct Python program "
    "that matches the specification and passes all tests."
)
_CODEQWEN_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user"
_QWQ_SYSTEM = (
    "<|im_start|>system\nYou are a helpful and harmless assistant. You are Qwen developed by Alibaba. "
    "You should think step-by-step.<|im_end|>\n<|im_start|>user"
)
_IM_END = "<|im_end|>\n"
_R1_SYSTEM = (
    "<｜begin▁of▁sentence｜>A conversation between User and Assistant. The user asks a question, and the "
    "Assistant solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within <think> "
    "</think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>.<｜User｜>"
)

Messages = list[dict[str, str]]


def generic_question(row: Mapping[str, Any]) -> str:
    """The user message of the chat styles (lcb_runner's generic question template)."""
    prompt = f"### Question:\n{row['question_content']}\n\n"
    if row["starter_code"]:
        prompt += f"### Format: {FORMAT_WITH_STARTER_CODE}\n```python\n{row['starter_code']}\n```\n\n"
    else:
        prompt += f"### Format: {FORMAT_WITHOUT_STARTER_CODE}\n```python\n# YOUR CODE HERE\n```\n\n"
    return prompt + "### Answer: (use the provided format with backticks)\n\n"


def _openai_chat(row: Mapping[str, Any]) -> Messages:
    return [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": generic_question(row)}]


def _llama3(row: Mapping[str, Any]) -> Messages:
    """The chat messages in Meta-Llama-3-8B-Instruct's chat template, which lcb_runner applies to
    every LLaMa3-style model (Llama-3.1 included, whose own template adds a date header)."""
    turns = "".join(
        f"<|start_header_id|>{message['role']}<|end_header_id|>\n\n{message['content'].strip()}<|eot_id|>"
        for message in _openai_chat(row)
    )
    return _raw(f"<|begin_of_text|>{turns}<|start_header_id|>assistant<|end_header_id|>\n\n")


def _question(row: Mapping[str, Any], task: str, code_end: str) -> str:
    """The question part of the text styles: task, question, format line and code block."""
    prompt = f"{task}\n\nQuestion: {row['question_content']}\n\n"
    if row["starter_code"]:
        return prompt + f"{FORMAT_WITH_STARTER_CODE}\n```python\n{row['starter_code']}\n```\n\n{code_end}"
    return prompt + f"{FORMAT_WITHOUT_STARTER_CODE}\n```python\n# YOUR CODE HERE\n```\n\n{code_end}"


def _codeqwen(row: Mapping[str, Any]) -> Messages:
    task = _TASK + " You will NOT return anything except for the program."
    return _raw(f"{_CODEQWEN_SYSTEM}\n\n{_question(row, task, _IM_END)}<|im_start|>assistant\n")


def _qwq(row: Mapping[str, Any]) -> Messages:
    return _raw(f"{_QWQ_SYSTEM}\n\n{_question(row, _TASK, _IM_END)}<|im_start|>assistant\n")


def _deepseek_r1(row: Mapping[str, Any]) -> Messages:
    return _raw(f"{_R1_SYSTEM}{_question(row, _TASK, '')}<｜Assistant｜>")


def _raw(text: str) -> Messages:
    return [{"role": RAW_ROLE, "content": text}]


STYLES: Mapping[str, Callable[[Mapping[str, Any]], Messages]] = MappingProxyType(
    {style: globals()[f"_{style}"] for style in PROMPT_STYLES}
)
"""Every prompt style by its ``prompt_style`` name, the generic chat style (the default) first."""


def build_messages(row: Mapping[str, Any], style: str = PROMPT_STYLES[0]) -> Messages:
    """The prompt of ``row`` in ``style``: chat messages, or one :data:`RAW_ROLE` message."""
    if style not in STYLES:
        raise ValueError(f"unknown prompt style {style!r}; choose one of {', '.join(STYLES)}")
    return STYLES[style](row)
