"""Quantized checkpoints are refused with what they are and what to do instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.export.errors import UnsupportedModelError


def quantization_refusal(hf: Mapping[str, Any], where: str) -> UnsupportedModelError | None:
    """The error for a quantized checkpoint (``quantization_config``, or MLX's ``quantization``), else None."""
    if hf.get("quantization_config"):
        settings = hf["quantization_config"]
        method = str(settings.get("quant_method", "unknown method")) if isinstance(settings, dict) else "?"
        key = "quantization_config"
    elif hf.get("quantization"):
        settings, method, key = hf["quantization"], "mlx", "quantization"
    else:
        return None
    bits = _bits(settings)
    label = {"awq": "AWQ", "gptq": "GPTQ", "mlx": "MLX", "bitsandbytes": "bitsandbytes", "fp8": "FP8"}.get(
        method.lower(), method
    )
    what = f"{label} {bits}-bit" if bits is not None else f"{label} (bits not stated)"
    return UnsupportedModelError(
        f"{where}: the checkpoint is quantized ({what}, {key!r}): Halyard trains in floating point and "
        "imports float32 / bfloat16 / float16 weights only. Dequantize first (e.g. load it with "
        "transformers, call model.dequantize() where the method supports it, and save_pretrained a copy), "
        "or download the unquantized checkpoint it was made from"
    )


def _bits(settings: Any) -> int | None:
    if not isinstance(settings, dict):
        return None
    if isinstance(settings.get("bits"), int):
        return int(settings["bits"])
    for flag, bits in (("load_in_4bit", 4), ("load_in_8bit", 8)):
        if settings.get(flag):
            return bits
    return None
