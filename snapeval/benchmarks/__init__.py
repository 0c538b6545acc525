"""Benchmarks: prompts, answer extraction and scoring as pure functions over strings and rows."""

THINK_END = "</think>"
ANSWER_FROM = ("response", "after_reasoning")


def after_reasoning(text: str) -> str:
    """The final answer part of a reasoning model's output: the text after its last ``</think>``."""
    return text.rpartition(THINK_END)[2]


def answer_part(text: str, answer_from: str) -> str:
    """Where an answer is looked for: the whole ``response``, or only the text ``after_reasoning``."""
    if answer_from == "response":
        return text
    if answer_from == "after_reasoning":
        return after_reasoning(text)
    raise ValueError(f"unknown answer_from {answer_from!r}; choose one of {', '.join(ANSWER_FROM)}")
