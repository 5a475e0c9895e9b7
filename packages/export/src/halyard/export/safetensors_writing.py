"""Writing a safetensors file one tensor at a time, so only one tensor is ever in host memory.

A safetensors file is an 8-byte little-endian header length, a JSON header (``"__metadata__"`` then, for
every tensor, its dtype, shape and ``data_offsets`` into the data area), padded with spaces to a multiple
of 8 bytes, then every tensor's raw little-endian bytes back to back. The header depends only on names,
shapes and dtypes, so it is written first and each tensor's bytes follow as the tensor is produced.

The output is byte-identical to ``safetensors.numpy.save_file`` of the same tensors: that writer orders
tensors by dtype (larger first) then by name, writes compact JSON and pads with spaces. Every tensor of
one export has the same dtype, so `write_safetensors` requires one dtype and orders by name.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

SAFETENSORS_DTYPE_NAMES = {np.dtype(np.float32): "F32", np.dtype(ml_dtypes.bfloat16): "BF16"}
"""The dtypes an export writes, with their names in a safetensors header."""


def safetensors_header(
    shapes: Mapping[str, tuple[int, ...]], dtype: np.dtype, metadata: Mapping[str, str] | None = None
) -> tuple[bytes, list[str]]:
    """The header bytes (length prefix included) and the order in which the tensors' bytes must follow.

    Args:
        shapes: tensor name -> shape.
        dtype: the dtype of every tensor (`SAFETENSORS_DTYPE_NAMES`).
        metadata: string -> string pairs stored as ``"__metadata__"`` (``{"format": "pt"}`` for PyTorch).

    Raises:
        ValueError: a dtype safetensors export does not write.
    """
    dtype = np.dtype(dtype)
    if dtype not in SAFETENSORS_DTYPE_NAMES:
        raise ValueError(
            f"cannot write dtype {dtype} to safetensors; choose one of {list(SAFETENSORS_DTYPE_NAMES)}"
        )
    order = sorted(shapes)  # save_file's order for one dtype: by name (code points = UTF-8 byte order)
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in order:
        size = math.prod(shapes[name]) * dtype.itemsize
        header[name] = {
            "dtype": SAFETENSORS_DTYPE_NAMES[dtype],
            "shape": list(shapes[name]),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, order


def write_safetensors(
    path: str | Path | None,
    shapes: Mapping[str, tuple[int, ...]],
    dtype: np.dtype,
    produce: Callable[[str], np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a safetensors file, asking ``produce`` for each tensor in file order and dropping it after.

    Args:
        path: the file to write; None produces every tensor in the same order without writing (a process
            that takes part in multi-process gathers while another one writes).
        shapes: tensor name -> shape, which fixes the header before any tensor exists.
        dtype: the dtype of every tensor.
        produce: name -> the tensor (shape ``shapes[name]``, dtype ``dtype``); called once per tensor.
        metadata: the header's ``"__metadata__"``.

    Raises:
        ValueError: ``produce`` returned a tensor whose shape or dtype differs from the header's.
    """
    if sys.byteorder != "little":
        raise RuntimeError("safetensors export writes host bytes as they are: it needs a little-endian host")
    header, order = safetensors_header(shapes, dtype, metadata)
    with open(path, "wb") if path is not None else _NoFile() as file:
        file.write(header)
        for name in order:
            tensor = produce(name)
            if tuple(tensor.shape) != tuple(shapes[name]) or tensor.dtype != np.dtype(dtype):
                raise ValueError(
                    f"tensor {name!r} is {tensor.dtype}{list(tensor.shape)}, the header says "
                    f"{np.dtype(dtype)}{list(shapes[name])}"
                )
            file.write(np.ascontiguousarray(tensor).reshape(-1).view(np.uint8).data)
            del tensor


class _NoFile:
    """A write sink that discards everything (processes other than the writer)."""

    def __enter__(self) -> _NoFile:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def write(self, data: object) -> None:
        del data
