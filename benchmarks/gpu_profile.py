"""``benchmarks/gpu.py --profile DIR``: the top kernels of a few decode steps under ``torch.profiler``.

A :class:`StepProfile` is ticked once after every decode step (the engine's: also once after the prefill
that starts its run, through a request's ``should_stop``). It lets ``SKIP`` ticks pass, warms the profiler
up for one step, records ``steps`` steps, and then writes the top kernels per step to a text file: name,
calls per step, microseconds per step and share of the step's wall time under the profiler (per step =
total over the recorded steps / steps). On CUDA these are the device's kernels (CUDA activity only, so
the host side adds as little as it can); on a CPU the operators (CPU activity).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tabulate import tabulate
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

SKIP = 3  # ticks before the profiler's warm-up step: the engine's prefill and two decode steps
MOST_STEPS = 8  # steps recorded, at most
LEAST_TOKENS = SKIP + 3  # new tokens (--steps) a profiled run needs: one step recorded
TOP = 15  # kernels listed
NAME_CHARS = 110  # kernel names cut to this length (CUDA template names run to hundreds)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def recorded_steps(new_tokens: int) -> int:
    """Steps recorded in a run of ``new_tokens`` tokens (the first from the prefill, at least
    :data:`LEAST_TOKENS`): up to ``MOST_STEPS``, leaving room for the skipped ticks, the warm-up step and
    the last tick."""
    return min(MOST_STEPS, new_tokens - SKIP - 2)


def setting_profile(args, title: str) -> StepProfile | None:
    """With ``--profile DIR`` (``args.profile``): the profile of the decode setting ``title``
    ("8192 tokens, full, 4 rows, compile on"), to be written to DIR/8192_full_4_on.txt."""
    if args.profile is None:
        return None
    stem = title.replace(" tokens", "").replace(" rows", "").replace("compile ", "").replace(",", "")
    path = args.profile / (stem.replace(" ", "_").lower() + ".txt")
    return StepProfile(args.device, recorded_steps(args.steps), path, [args.header, f"decode: {title}"])


class StepProfile:
    """Profiles ``steps`` decode steps of one setting and writes its top kernels to ``path`` under the
    lines of ``title``. Use as a context manager around the steps, ticking after each."""

    def __init__(self, device: torch.device, steps: int, path: Path, title: list[str]) -> None:
        self.device, self.steps, self.path, self.title = device, steps, path, title
        activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
        self.profiler = torch.profiler.profile(
            activities=[activity],
            schedule=torch.profiler.schedule(wait=SKIP, warmup=1, active=steps, repeat=1),
            on_trace_ready=self.write,
        )
        self.ticks, self.start, self.seconds, self.written = 0, 0.0, 0.0, False

    @property
    def ticks_needed(self) -> int:
        """Ticks until the file is written."""
        return SKIP + 1 + self.steps

    def __enter__(self) -> StepProfile:
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.profiler.__exit__(*exc)

    def tick(self, *_) -> bool:
        """After a step: advance the profiler's schedule; True once the file is written (any arguments,
        such as ``should_stop``'s tokens, are ignored)."""
        synchronize(self.device)
        self.ticks += 1
        if self.ticks == self.ticks_needed:
            self.seconds = time.perf_counter() - self.start
        self.profiler.step()  # at the last tick: stops recording and writes the file
        if self.ticks == SKIP + 1:
            self.start = time.perf_counter()  # recording starts
        return self.written

    def write(self, profiler: torch.profiler.profile) -> None:
        cuda = self.device.type == "cuda"
        own = "self_device_time_total" if cuda else "self_cpu_time_total"
        kind = DeviceType.CUDA if cuda else DeviceType.CPU  # kernels, or the host's operators
        events = sorted(
            (e for e in profiler.key_averages() if e.device_type == kind and getattr(e, own) > 0),
            key=lambda event: getattr(event, own),
            reverse=True,
        )
        step_us = 1e6 * self.seconds / self.steps
        busy_us = sum(getattr(event, own) for event in events) / self.steps
        rows = [
            [
                short(event.key),
                f"{event.count / self.steps:g}",
                f"{getattr(event, own) / self.steps:,.1f}",
                f"{getattr(event, own) / self.steps / step_us:.1%}",
            ]
            for event in events[:TOP]
        ]
        what = "kernels (CUDA activity)" if cuda else "operators (CPU activity, self time)"
        lines = [
            *self.title,
            f"{self.steps} steps recorded after warm-up: {step_us / 1000:.2f} ms/step wall under the "
            f"profiler; {what} {busy_us / 1000:.2f} ms/step ({busy_us / step_us:.0%})",
            "",
            tabulate(rows, headers=["kernel" if cuda else "operator", "calls/step", "us/step", "share"]),
        ]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(lines) + "\n")
        self.written = True


def short(name: str) -> str:
    if name.startswith("ProfilerStep"):  # the step's own span: its self time is outside every operator
        return "(host work outside operators)"
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."
