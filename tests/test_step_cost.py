"""A decode step's work depends on the slots its rows hold, not on how long their prompts were (issue 46
item 3): the ops of one batcher step, their input shapes and the bytes they allocate are the same after
a short and a long prompt, for fixed-slot methods on full, sliding-window and mixed-layer families.

Counted with ``torch.profiler`` (CPU, ``record_shapes``, ``profile_memory``) around one step of
:class:`~snapeval.decode.continuous.ContinuousBatcher`, after its first steps.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from snapeval.cache import install
from snapeval.decode.continuous import ContinuousBatcher, Request
from tests.families import FAMILIES

VOCAB = 320
SHORT, LONG = 100, 700  # both past the families' sliding window (64) and the budgets
SNAPSTREAM = {"method": "snapstream", "budget": 40, "window": 4, "sinks": 2, "ring": 16}
SETTINGS = {
    "snapstream": SNAPSTREAM,
    "snapstream-reselect": {**SNAPSTREAM, "reselect_every": 8},
    "streaming_llm-rerotate": {"method": "streaming_llm", "budget": 24, "sinks": 2, "rerotate": True},
}
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module", params=["llama", "mistral", "gemma3"])
def model(request) -> torch.nn.Module:
    return install(FAMILIES[request.param](VOCAB))


def step_ops(model: torch.nn.Module, cache: dict, prompt_length: int, rows: int = 3, profiled: int = 5):
    """(sorted (op, input shapes) of every aten op, bytes the step allocates) of decode step
    ``profiled`` of ``rows`` rows after a ``prompt_length``-token prompt."""
    generator = torch.Generator().manual_seed(prompt_length)
    ids = tuple(torch.randint(3, VOCAB, (prompt_length,), generator=generator).tolist())
    batcher = ContinuousBatcher(model, rows, "off")
    original, taken = batcher.step, []

    def step(*args):
        if len(taken) != profiled:
            taken.append(None)
            return original(*args)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as run:
            tokens = original(*args)
        taken.append(run)
        return tokens

    batcher.step = step
    batcher.run([Request(ids, cache, profiled + 3, tag=row) for row in range(rows)], lambda answer: None)
    events = [event for event in taken[profiled].events() if event.name.startswith("aten::")]
    ops = sorted((event.name, str(event.input_shapes)) for event in events)
    allocated = sum(max(event.cpu_memory_usage, 0) for event in events)
    return ops, allocated


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_steps_ops_and_bytes_do_not_grow_with_the_prompt(model, setting):
    short_ops, short_bytes = step_ops(model, SETTINGS[setting], SHORT)
    long_ops, long_bytes = step_ops(model, SETTINGS[setting], LONG)
    assert short_ops  # the profiler saw the step
    assert long_ops == short_ops
    assert long_bytes == short_bytes  # catches ops sized by a scalar (arange up to the position)
