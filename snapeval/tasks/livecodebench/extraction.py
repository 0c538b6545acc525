"""The program in a model's output: lcb_runner's extraction, or a lenient one."""

from __future__ import annotations

from snapeval.configs.task import CODE_EXTRACTIONS
from snapeval.tasks.base import after_reasoning

_PYTHON_FENCE_TAGS = frozenset({"", "python", "python3", "py"})


def extract_code(text: str, mode: str = CODE_EXTRACTIONS[0]) -> str | None:
    """The program in a model's output, by ``mode`` (one of :data:`~snapeval.configs.task.CODE_EXTRACTIONS`):

    * ``official`` (lcb_runner's ``extract_code``): the lines between the last two lines that contain
      a fence (```), whatever their tag, anywhere in the output, reasoning included; None with fewer
      than two fence lines;
    * ``lenient``: the last complete block tagged python (or untagged) after any reasoning trace,
      fences being lines that start with ```; None if there is none.
    """
    if mode == "official":
        lines = text.split("\n")
        fences = [index for index, line in enumerate(lines) if "```" in line]
        return "\n".join(lines[fences[-2] + 1 : fences[-1]]) if len(fences) >= 2 else None
    if mode != "lenient":
        raise ValueError(f"unknown code extraction {mode!r}; choose one of {', '.join(CODE_EXTRACTIONS)}")
    blocks: list[tuple[str, str]] = []
    tag: str | None = None
    body: list[str] = []
    for line in after_reasoning(text).splitlines():
        stripped = line.strip()
        if tag is None:
            if stripped.startswith("```"):
                tag, body = (stripped[3:].split() or [""])[0].lower(), []
        elif stripped == "```":
            blocks.append((tag, "\n".join(body)))
            tag = None
        else:
            body.append(line)
    python = [code for tag, code in blocks if tag in _PYTHON_FENCE_TAGS]
    return python[-1] if python else None
