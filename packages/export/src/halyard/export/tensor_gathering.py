"""Assembling one Hugging Face tensor on the host from (possibly sharded) Halyard parameters.

The tensor is allocated once, in the export dtype and Hugging Face layout, and every device's block of
each contributing parameter is copied straight into its place: the transient host memory is the tensor
itself plus one device block. On CPU a device block is the device's own buffer (no copy); on an
accelerator only the block's slice at the wanted stacked index (one layer, one expert) is copied to the
host. Arrays that span several processes are gathered whole with ``process_allgather`` (every process
must take part, in the same order).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from halyard.export.plan import LeafPlan

Contribution = tuple[LeafPlan, dict[str, int]]
"""A parameter and one index along each of its stacked axes: one share of a Hugging Face tensor."""


def _whole_block(array: jax.Array, index: tuple[Any, ...]) -> np.ndarray:
    """``array[index]`` on this host, gathered from every process when the array spans several."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array[index], tiled=True))


def host_view_is_free(device: jax.Device) -> bool:
    """Whether ``np.asarray`` of a buffer on ``device`` is a view rather than a copy (CPU devices)."""
    return device.platform == "cpu"


def _device_blocks(plan: LeafPlan, indices: dict[str, int]) -> Iterator[tuple[np.ndarray, list[slice]]]:
    """Host copies of every distinct device block of ``plan``'s parameter at the stacked ``indices``.

    Yields ``(block, target_slices)``: the block in Halyard axis order (stacked axes dropped, vocabulary
    rows beyond the export cut dropped) and where it lies along each target axis.
    """
    array = plan.leaf.array
    stacked = [indices[name] for name in plan.mapping.stacked]
    limits = [plan.hf_sizes[name] for name in plan.mapping.target]
    if not isinstance(array, jax.Array):
        array = jax.numpy.asarray(array)
    if not array.is_fully_addressable:
        cut = tuple(stacked) + tuple(slice(0, limit) for limit in limits)
        yield _whole_block(array, cut), [slice(0, limit) for limit in limits]
        return
    seen: set[tuple[tuple[int, int], ...]] = set()
    for shard in array.addressable_shards:
        ranges = tuple(part.indices(size)[:2] for part, size in zip(shard.index, array.shape))
        if ranges in seen:  # a replica of a block already copied
            continue
        seen.add(ranges)
        stacked_ranges, target_ranges = ranges[: len(stacked)], ranges[len(stacked) :]
        if not all(start <= i < stop for i, (start, stop) in zip(stacked, stacked_ranges)):
            continue
        clipped = [(start, min(stop, limit)) for (start, stop), limit in zip(target_ranges, limits)]
        if any(start >= stop for start, stop in clipped):
            continue  # only vocabulary padding
        local: tuple[Any, ...] = tuple(i - start for i, (start, _) in zip(stacked, stacked_ranges))
        local += tuple(slice(0, stop - start) for start, stop in clipped)
        whole = not stacked and all(c == r for c, r in zip(clipped, target_ranges))
        if whole:
            block = np.asarray(shard.data)
        elif host_view_is_free(shard.device):
            block = np.asarray(shard.data)[local]  # a view of the device buffer: nothing is copied
        else:
            block = np.asarray(jax.device_get(shard.data[local]))
        yield block, [slice(start, stop) for start, stop in clipped]


def gather_tensor(contributions: list[Contribution], dtype: np.dtype) -> np.ndarray:
    """One Hugging Face tensor in ``dtype``, assembled from every (parameter, stacked index) in it.

    Args:
        contributions: the parameters and stacked indices that make up the tensor (several for GPT-2's
            fused ``c_attn``, one otherwise).
        dtype: the export dtype; values are rounded to it once (through float32 for other source dtypes).
    """
    first = contributions[0][0]
    full = first.mapping.sizes_with_part(first.hf_sizes)
    tensor = np.zeros(first.hf_shape(), dtype=dtype)
    view = tensor.reshape([full[name] for name in first.mapping.view_names])
    for plan, indices in contributions:
        for block, target_slices in _device_blocks(plan, indices):
            if block.dtype not in (np.dtype(np.float32), np.dtype(dtype)):
                block = block.astype(np.float32)
            plan.mapping.place(view, block, target_slices)
            del block
    return tensor
