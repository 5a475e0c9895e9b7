"""A step's host inputs in one transfer: every array packed into one int32 buffer, unpacked inside the program.

A step takes about 16 small arrays (tokens, positions, slots, the page table, the rows' sampling settings...).
Sent one by one, each is a host-to-device transfer with its own fixed cost, which on a TPU host added up to
more than the device's own step time of a 0.5B model's decode (benchmarks/README.md). Packed, they are one
transfer; the program slices and bitcasts them back (free next to the step). The previous program's drawn
tokens (``previous``, already on the device) stay apart.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import numpy as np

from halyard.serve.program import StepInputs


class Packing(NamedTuple):
    """Where each input lies in the buffer: the inputs' tree structure and each array's shape and dtype (in
    order). Static: a program is compiled for one packing."""

    treedef: Any
    arrays: tuple[tuple[tuple[int, ...], str], ...]


def pack(inputs: StepInputs) -> tuple[np.ndarray, Any, Packing]:
    """``inputs`` (``previous`` aside) as ``(one int32 buffer, previous, packing)``.

    Raises:
        ValueError: an input whose items are not 4 bytes (int32, uint32, float32), which the buffer cannot hold.
    """
    leaves, treedef = jax.tree.flatten(inputs._replace(previous=None))
    parts, arrays = [], []
    for leaf in leaves:
        array = np.asarray(leaf)
        if array.dtype.itemsize != 4:
            raise ValueError(
                f"a step input of dtype {array.dtype} does not pack into int32 (4-byte items only)"
            )
        parts.append(array.reshape(-1).view(np.int32))
        arrays.append((array.shape, array.dtype.str))
    return np.concatenate(parts), inputs.previous, Packing(treedef, tuple(arrays))


def unpack(buffer: jax.Array, previous: Any, packing: Packing) -> StepInputs:
    """The `StepInputs` `pack` packed into ``buffer`` (inside a program: slices and bitcasts)."""
    leaves, offset = [], 0
    for shape, dtype in packing.arrays:
        size = math.prod(shape)
        flat = jax.lax.bitcast_convert_type(buffer[offset : offset + size], np.dtype(dtype))
        leaves.append(flat.reshape(shape))
        offset += size
    inputs: StepInputs = jax.tree.unflatten(packing.treedef, leaves)
    return inputs._replace(previous=previous)
