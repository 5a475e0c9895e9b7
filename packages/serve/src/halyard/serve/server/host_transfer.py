"""The TPU runtime's premapped host buffer, sized for the weights a server loads, and the weights put on the
device through it.

libtpu stages host-to-device transfers through a buffer of pinned host memory it maps when it starts
(``TPU_PREMAPPED_BUFFER_SIZE``; 4 GiB by default on v5e and newer). Mapping it is most of the runtime's start
on a VM without transparent hugepages: about 1.1 s a GiB on the one-chip v5e machine, 6 s of a 6.6 s start.
A transfer that does not fit in what is free of it (more than ``TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES``,
by default the size) takes a slower path: there, a 1 GiB put took 3.1 s through a 256 MiB buffer against
0.24 s through the default one. So a server sizes the buffer for the largest tensor it will put (a power of
two, at least `SMALLEST_BUFFER_BYTES`), before the runtime starts, and puts the weights in groups that fit it,
one group after the other (benchmarks/README.md, the warm start on the chip).

A size set in the environment is kept, and the groups follow it. The largest tensor is read from the
folder's safetensors headers (`largest_tensor_bytes`), with nothing imported that the runtime's start would
wait for.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import jax

BUFFER_ENV = "TPU_PREMAPPED_BUFFER_SIZE"
THRESHOLD_ENV = "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"
DEFAULT_BUFFER_BYTES = 4 * 2**30
"""libtpu's buffer when ``TPU_PREMAPPED_BUFFER_SIZE`` is not set (its log: "TPU premapped buffer enabled.
Size: 4294967296 Threshold: 4294967296")."""
SMALLEST_BUFFER_BYTES = 256 * 2**20
"""The smallest buffer chosen: room for a step's inputs and outputs beside nothing else."""


STORED_ITEMSIZE = {"F32": 4, "BF16": 2, "F16": 2}
"""Bytes of an element of the safetensors dtypes a server keeps under ``--dtype auto`` (others become float32)."""
SERVED_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes of an element in each dtype ``--dtype`` names."""
LARGEST_HEADER_BYTES = 100 * 2**20
"""A safetensors header longer than this is damaged (the format's own limit)."""


def size_host_buffer(folder: str | Path, dtype: str = "auto") -> int | None:
    """Size the premapped buffer for ``folder``'s largest tensor in the served ``dtype`` (``--dtype``:
    ``auto``, ``float32``, ``bfloat16``, ``float16``); call it before JAX's backend starts.

    Returns:
        The size in effect, or None where the folder cannot be sized (no safetensors weights, a damaged
        header): the runtime's default then, and loading the folder reports what is wrong.
    """
    try:
        largest = largest_tensor_bytes(Path(folder), dtype)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None if largest is None else size_premapped_buffer(largest)


def largest_tensor_bytes(folder: Path, dtype: str = "auto") -> int | None:
    """The bytes of ``folder``'s largest tensor once in ``dtype`` (`size_host_buffer`), from its safetensors
    headers; None where it has no safetensors weights.

    Raises:
        OSError, ValueError, KeyError, TypeError: a header that cannot be read.
    """
    largest = None
    for header in _safetensors_headers(folder):
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            itemsize = SERVED_ITEMSIZE.get(dtype, STORED_ITEMSIZE.get(entry["dtype"], 4))
            largest = max(largest or 0, math.prod(entry["shape"]) * itemsize)
    return largest


def _safetensors_headers(folder: Path) -> Iterator[dict[str, Any]]:
    """The JSON header of each of ``folder``'s safetensors files (``model.safetensors`` or the index's)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        names = ["model.safetensors"]
    else:
        return
    for name in names:
        with open(folder / name, "rb") as weights:
            (length,) = struct.unpack("<Q", weights.read(8))
            if length > LARGEST_HEADER_BYTES:
                raise ValueError(f"{folder / name}: a header of {length} bytes")
            yield json.loads(weights.read(length))


def buffer_bytes_for(largest_tensor_bytes: int) -> int:
    """The buffer for weights whose largest tensor has ``largest_tensor_bytes``: the next power of two, at least
    `SMALLEST_BUFFER_BYTES`, at most `DEFAULT_BUFFER_BYTES` (a larger tensor goes the slow path either way)."""
    size = SMALLEST_BUFFER_BYTES
    while size < largest_tensor_bytes and size < DEFAULT_BUFFER_BYTES:
        size *= 2
    return size


def size_premapped_buffer(largest_tensor_bytes: int, environ: MutableMapping[str, str] | None = None) -> int:
    """Set ``TPU_PREMAPPED_BUFFER_SIZE`` in ``environ`` (default ``os.environ``) for a largest tensor of
    ``largest_tensor_bytes``, unless it is set; the size in effect. Call it before JAX's backend starts."""
    environ = os.environ if environ is None else environ
    if BUFFER_ENV not in environ:
        environ[BUFFER_ENV] = str(buffer_bytes_for(largest_tensor_bytes))
    return int(environ[BUFFER_ENV])


def transfer_limit(environ: MutableMapping[str, str] | None = None) -> int | None:
    """The most bytes to put on the device at once: the premapped buffer's size or its threshold, whichever is
    smaller, on a TPU; None (no limit) on other backends."""
    if jax.default_backend() != "tpu":
        return None
    environ = os.environ if environ is None else environ
    size = int(environ.get(BUFFER_ENV, DEFAULT_BUFFER_BYTES))
    return min(size, int(environ.get(THRESHOLD_ENV, size)))


def put_in_groups(tree: Any, limit: int | None) -> Any:
    """``jax.device_put(tree)``, its leaves put in groups of at most ``limit`` bytes (a larger leaf alone), each
    group on the device before the next starts; None: all at once."""
    if limit is None:
        return jax.device_put(tree)
    leaves, structure = jax.tree.flatten(tree)
    placed: list[Any] = []
    group: list[Any] = []
    group_bytes = 0
    for leaf in leaves:
        size = int(getattr(leaf, "nbytes", 0))
        if group and group_bytes + size > limit:
            placed.extend(jax.block_until_ready(jax.device_put(group)))
            group, group_bytes = [], 0
        group.append(leaf)
        group_bytes += size
    placed.extend(jax.block_until_ready(jax.device_put(group)))
    return jax.tree.unflatten(structure, placed)
