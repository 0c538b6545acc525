"""Benchmarks: prompts, answer extraction and scoring as pure functions over strings and rows."""

THINK_END = "</think>"


def after_reasoning(text: str) -> str:
    """The final answer part of a reasoning model's output: the text after its last ``</think>``."""
    return text.rpartition(THINK_END)[2]
