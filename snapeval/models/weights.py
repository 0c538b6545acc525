"""How a loaded model holds its weights, for the run to store: an FP8 checkpoint (DeepSeek-V3/R1's release:
``float8_e4m3fn`` weights with block scales, its ``quantization_config`` saying so) runs on FP8 kernels
where the device has them (transformers' FP8 layers keep the weights in FP8) and dequantized where it does
not (transformers does so on a CPU, or a GPU below compute capability 8.9, into the dtype the run asked);
any other checkpoint holds the dtype it was loaded in.
"""

from __future__ import annotations

from typing import Any

import torch

FP8 = "fp8"  # quantization_config.quant_method of a block-scaled FP8 checkpoint
FP8_KERNELS = "fp8 kernels"
FP8_DEQUANTIZED = "fp8 dequantized to {dtype}"


def quantization(config: Any) -> str | None:
    """The checkpoint's ``quantization_config.quant_method`` (``fp8``), or None for plain weights."""
    settings = getattr(config, "quantization_config", None)
    if settings is None:
        return None
    method = (
        settings.get("quant_method")
        if isinstance(settings, dict)
        else getattr(settings, "quant_method", None)
    )
    return str(getattr(method, "value", method))


def weights_path(model: torch.nn.Module, checkpoint: Any) -> str:
    """How ``model``, loaded from a checkpoint of config ``checkpoint`` (as read before loading:
    transformers drops the ``quantization_config`` of a model it dequantized), runs its weights:
    ``fp8 kernels``, ``fp8 dequantized to float32`` (or bfloat16), or the dtype of plain weights."""
    dtypes = {parameter.dtype for parameter in model.parameters()}
    if quantization(checkpoint) == FP8:
        if torch.float8_e4m3fn in dtypes:
            return FP8_KERNELS
        return FP8_DEQUANTIZED.format(dtype=str(model.dtype).removeprefix("torch."))
    return str(model.dtype).removeprefix("torch.")
