"""A decode step writes one slot per row and layer in place (issue 46 item 1): no copy of a whole K/V
buffer, neither in the compiled step (read in inductor's generated code) nor in an eager one (every
tensor the step allocates, seen by a dispatch mode).

Compiled: every store the generated kernels make into a slot buffer (keys, values, slot columns) is at an
index computed from a loaded value (the row's slot), never at one that walks the whole buffer, and no
buffer of a slot buffer's size is allocated (an out-of-place scatter) or copied back.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from snapeval.cache import install
from snapeval.decode.continuous import ContinuousBatcher, Request
from tests.families import FAMILIES

VOCAB = 320
SNAPSTREAM = {"method": "snapstream", "budget": 40, "window": 4, "sinks": 2, "ring": 16}
FULL = {"method": "full"}
REROTATED = {"method": "streaming_llm", "budget": 40, "sinks": 4, "rerotate": True}
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def requests(new_tokens: int) -> list[Request]:
    """Two row classes (SnapStream's 40 slots, the full cache's prompt + answer) over a 150-token prompt."""
    ids = tuple(range(5, 155))
    return [Request(ids, cache, new_tokens, tag=index) for index, cache in enumerate([SNAPSTREAM, FULL] * 2)]


def slot_buffers(batcher: ContinuousBatcher) -> list[torch.Tensor]:
    """Every layer's keys, values and slot columns, in every row class."""
    return [t for part in batcher.slots.parts for t in (*part.keys, *part.values, *part.positions)]


KERNEL = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\(.*?kernel\((.*?)\)\s*\{(.*?)^'''", re.M | re.S)
CALL = re.compile(r"^\s+(\w+)\(([\w, ]*)\)$", re.M)
SHAPE = re.compile(r"assert_size_stride\((\w+), \(([\d, ]+)\),")
STORE = r"{name}\[static_cast<int64_t>\((.*?)\)\] =|\.store\({name} \+ static_cast<int64_t>\((.*?)\)"


def stores_into(code: str, shapes: set[tuple[int, ...]]) -> tuple[list[tuple[str, int | None]], list[str]]:
    """((index expression, slots its loop walks) of every store the generated kernels make into a graph
    input of one of ``shapes``, wrapper lines that copy into one or allocate one of its size). The slots
    walked: the bound of the loop over the variable the index multiplies by a slot's width (None: none)."""
    inputs = {
        name for name, dims in SHAPE.findall(code) if tuple(map(int, re.findall(r"\d+", dims))) in shapes
    }
    kernels = {
        name: ([p.split()[-1].lstrip("*") for p in params.split(",")], body)
        for name, params, body in KERNEL.findall(code)
    }
    indices = []
    for name, arguments in CALL.findall(code):
        if name not in kernels:
            continue
        params, body = kernels[name]
        for param, argument in zip(params, arguments.split(", "), strict=True):
            if argument in inputs and "out_ptr" in param:
                for found in re.finditer(STORE.format(name=param), body):
                    index = found.group(1) or found.group(2)
                    indices.append((index, slots_walked(index, body[: found.start()])))
    sizes = "|".join(re.escape(", ".join(map(str, shape))) for shape in shapes)
    whole = re.findall(
        rf"^.*(?:empty_strided\w*\(\(({sizes})\)|\b(?:{'|'.join(inputs)})\.copy_\().*$", code, re.M
    )
    return indices, whole


def slots_walked(index: str, before: str) -> int | None:
    """The bound of the innermost loop before a store over the variable its ``index`` multiplies by a
    slot's width (the head width, 16 here), or None."""
    slot = re.search(r"\b16L\*(x\d+)", index)
    if slot is None:
        return None
    bounds = re.findall(rf"{slot.group(1)}<static_cast<int64_t>\((\d+)L\)", before)
    return int(bounds[-1]) if bounds else None


def test_the_compiled_step_stores_only_the_new_slots():
    """SnapStream, full and re-rotating StreamingLLM rows: a store at a loaded slot index, or one walking
    the 4 sink slots a re-rotating row turns in place; never a walk over a whole buffer."""
    model = install(FAMILIES["llama"](VOCAB))
    batcher = ContinuousBatcher(model, 4, "on")
    rerotated = Request(tuple(range(5, 155)), REROTATED, 4, tag="rerotated")
    _, codes = run_and_get_code(lambda: batcher.run([*requests(4), rerotated], lambda answer: None))
    shapes = {tuple(buffer.shape) for buffer in slot_buffers(batcher)}
    assert len(shapes) == 4  # keys/values and columns of two row classes
    indices, whole = stores_into("\n".join(codes), shapes)
    assert whole == []
    walks = [walked for index, walked in indices if "tmp" not in index]  # not at a loaded slot index
    layers, classes = model.config.num_hidden_layers, len(batcher.slots.parts)
    assert len(indices) - len(walks) >= 3 * layers * classes  # each layer's keys, values, columns, per class
    assert walks  # the sinks
    assert all(walked is not None and walked <= REROTATED["sinks"] for walked in walks), indices


class Allocations(TorchDispatchMode):
    """Bytes of every tensor storage an op returns that none of its inputs held (a new allocation)."""

    def __init__(self) -> None:
        super().__init__()
        self.allocated: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        given = {
            t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        for tensor in tree_leaves(output):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in given:
                self.allocated.append((str(func), tensor.untyped_storage().nbytes()))
        return output


@pytest.mark.parametrize("family", ["llama", "gemma3"])  # full layers; sliding-window and full layers
def test_an_eager_step_allocates_nothing_the_size_of_a_layers_buffer(family):
    """SnapStream and full rows, and StreamingLLM rows whose sinks are re-rotated at every step."""
    model = install(FAMILIES[family](VOCAB))
    batcher = ContinuousBatcher(model, 4, "off")
    original, seen = batcher.step, []

    def step(*args):
        if len(seen) != 2:  # after the first steps: what every step does
            seen.append(None)
            return original(*args)
        with Allocations() as mode:
            tokens = original(*args)
        seen.append(mode)
        return tokens

    batcher.step = step
    rerotated = Request(tuple(range(5, 155)), REROTATED, 4, tag="rerotated")  # its sinks turn in place
    batcher.run([*requests(4), rerotated], lambda answer: None)
    layers = [t for part in batcher.slots.parts for t in (*part.keys, *part.values)]
    smallest = min(buffer.untyped_storage().nbytes() for buffer in layers)
    allocated = seen[2].allocated
    assert allocated  # the mode saw the step
    assert max(size for _, size in allocated) < smallest, sorted(allocated, key=lambda a: -a[1])[:3]
