"""Peak host memory while a model loads: the old path vs ``snapeval.models.load_model``.

Two ways to load each model, each in a fresh process:

* ``old: from_pretrained + .to``: ``AutoModelForCausalLM.from_pretrained`` with no ``device_map`` (the
  whole model built in host memory), then ``model.to(device)``: what ``load_model`` did before;
* ``load_model (device_map)``: :func:`snapeval.models.load_model`, which passes ``device_map=<device>``
  so that each weight goes straight to the device.

Both read the model's config (a GGUF's metadata: its whole vocabulary) and assemble a package's weights
before the measurement starts, and on CUDA start the CUDA context then too. Measured: the peak resident
set size of the process while loading (Linux: ``VmHWM``, reset through ``/proc/self/clear_refs`` after the
imports; elsewhere ``ru_maxrss``) minus that after the imports, the bytes of the loaded parameters, their
ratio, the seconds, and on CUDA the peak device memory allocated.

On a CPU the device *is* host memory, so both paths hold the weights in host memory by the end; what a
CPU run shows is whether either path holds extra copies while loading. On a GPU the load_model row is
expected to stay far below the weights (a GGUF is dequantized on the host first, so not for a GGUF).

    python benchmarks/load_memory.py                                   # CPU: SmolLM2-135M, Gemma 3 270M
    python benchmarks/load_memory.py --device cuda                     # on a GPU
    python benchmarks/load_memory.py --models smollm2-135m /path/to/a/transformers/folder
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from arguments import at_least
from machine import MIB, PeakRss, available_cores, cpu_model

from snapeval.cli import one_line_errors

OLD = "old: from_pretrained + .to"
NEW = "load_model (device_map)"
PATHS = {"old": OLD, "new": NEW}
HEADERS = [
    "model",
    "device",
    "path",
    "load s",
    "peak host RSS over imports MiB",
    "min-max",
    "weights MiB",
    "ratio",
    "device peak MiB",
]


def child(model: str, path: str, device: str) -> dict:
    """In this (fresh) process: load ``model`` one way onto ``device``; what it took."""
    import torch
    from transformers import AutoModelForCausalLM

    from snapeval.errors import SnapevalError
    from snapeval.models import (
        base_attention,
        gguf_file,
        load_model,
        model_config,
        model_spec,
        resolve_device,
        resolve_dtype,
        resolve_pretrained,
    )

    spec = model_spec(model)
    spec = type(spec)(**{**spec.__dict__, "device": device})
    try:
        source = resolve_pretrained(spec.pretrained)  # a package's weights assembled, once
    except SnapevalError as exc:
        return {"skipped": str(exc)}
    config = model_config(spec)  # read once a process: the same for both paths
    target = resolve_device(spec.device)
    if target.type == "cuda":
        torch.zeros(1, device=target)  # the CUDA context, before the baseline
        torch.cuda.reset_peak_memory_stats(target)
    rss = PeakRss()
    rss.reset()
    baseline = rss.mib()  # on Linux, the resident set now (the high-water mark was just reset)
    start = time.perf_counter()
    if path == "old":
        loaded = AutoModelForCausalLM.from_pretrained(
            source,
            config=config,
            gguf_file=gguf_file(spec, source),
            dtype=resolve_dtype(spec.dtype, target),
            attn_implementation=base_attention(config),
        )
        loaded = loaded.to(target).eval()
    else:
        loaded = load_model(spec)
    if target.type == "cuda":
        torch.cuda.synchronize(target)
    seconds = time.perf_counter() - start
    peak = rss.mib() - baseline
    weights = sum(parameter.nbytes for parameter in loaded.parameters()) / MIB
    devices = sorted({str(parameter.device) for parameter in loaded.parameters()})
    device_peak = torch.cuda.max_memory_allocated(target) / MIB if target.type == "cuda" else None
    return {
        "seconds": seconds,
        "peak_mib": peak,
        "weights_mib": weights,
        "device_peak_mib": device_peak,
        "devices": devices,
        "source": rss.source,
    }


def measure(model: str, path: str, device: str) -> dict:
    """:func:`child` in a fresh Python process (no allocator state or cached model from another run)."""
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    root = str(Path(__file__).resolve().parents[1])  # snapeval, where it is not installed (GPU machines)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), root]))
    command = [sys.executable, __file__, "--child", model, path, device]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{model} ({path}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(
    models: list[str], device: str, repeats: int = 1, name_of=lambda model: model
) -> tuple[list[list], str]:
    """One table row per model and path (medians of ``repeats`` fresh processes, the paths taking turns),
    and the peak RSS source the children used."""
    table, source = [], ""
    for model in models:
        runs = {path: [] for path in PATHS}
        for _ in range(repeats):
            for path in PATHS:
                runs[path].append(measure(model, path, device))
        for path, label in PATHS.items():
            result = median(runs[path])
            if "skipped" in result:
                table.append([name_of(model), device, label, "skipped: " + result["skipped"], *[""] * 5])
                break
            source = result["source"]
            device_peak = result["device_peak_mib"]
            table.append(
                [
                    name_of(model),
                    ",".join(result["devices"]),
                    label,
                    f"{result['seconds']:.1f}",
                    f"{result['peak_mib']:,.0f}",
                    "-".join(f"{f(r['peak_mib'] for r in runs[path]):,.0f}" for f in (min, max)),
                    f"{result['weights_mib']:,.0f}",
                    f"{result['peak_mib'] / result['weights_mib']:.2f}",
                    "-" if device_peak is None else f"{device_peak:,.0f}",
                ]
            )
    return table, source


def median(results: list[dict]) -> dict:
    """The median of each number over runs (the other fields: the first run's)."""
    merged = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, (int, float)):
            merged[key] = statistics.median(result[key] for result in results)
    return merged


def header(device: str) -> str:
    import platform

    import torch
    import transformers

    name = device
    if device.startswith("cuda"):
        name = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}  {cpu_model()}, {available_cores()} cores, load average "
        f"{load}  torch {torch.__version__}  transformers {transformers.__version__}  Python "
        f"{platform.python_version()}  device: {name}"
    )


@one_line_errors
def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(child(*sys.argv[2:])))
        return 0
    from tabulate import tabulate

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    parser.add_argument(
        "--models",
        nargs="+",
        default=["smollm2-135m", "gemma-3-270m"],
        help="model configs in conf/model, Hub ids or local folders",
    )
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per path: the median")
    args = parser.parse_args()
    at_least(args, {"--repeats": 1})
    print(header(args.device))
    table, source = rows(args.models, args.device, args.repeats)
    print(f"peak host RSS: {source}; medians of {args.repeats} fresh process(es) per row\n")
    print(tabulate(table, headers=HEADERS, disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
