"""One weight gathered whole from its FSDP shards inside the invariant step, and its gradient reduced back
to the shards in the canonical order.

Inside the step's ``shard_map`` each batch device runs one canonical slice at a time (device ``d`` of ``D``
runs slice ``t * D + d`` at its step ``t``), so the ``D`` slices a step runs together are adjacent: the
pairwise tree's lowest ``log2(D)`` levels add them. `ShardedWeight.gather` is FSDP's all-gather (it adds
nothing, so it cannot change a bit); its backward pass receives each device's gradient of the whole weight
for its slice and adds the ``D`` of them in that tree, each device the elements of its own shard: an
all-to-all of the gradient's pieces (the traffic of a reduce-scatter) and adds in the tree order. A weight
that is whole on every device (replicated) is all-gathered after the adds (an all-reduce's traffic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from halyard.train.invariant.trees import tree_sum_in_one_pass

GATHERED = "invariant_gathered_weight"
"""The ``checkpoint_name`` of a gathered weight: the backward pass gathers it again rather than keep it."""


@dataclass(frozen=True)
class ShardedWeight:
    """Where one weight's shards are, for code running per device inside the invariant step's ``shard_map``.

    Args:
        dims: for each dimension of the whole weight, the mesh axes (of size > 1) it is split over, in the
            order of its ``PartitionSpec`` entry; ``()`` for a whole dimension.
        batch_axes: ``(name, size)`` of each batch axis, in mesh order: the device index ``d`` (and the
            slice order) is the linear index over them.
        dtype: the stored dtype (the shard's, and the reduced gradient's).
        compute_dtype: the dtype the gathered weight is cast to (the model's compute dtype), None to keep
            ``dtype``. The cast comes before the all-gather (half the traffic for bfloat16) and the gradient
            is reduced in ``dtype``, as one device converts each slice's gradient before adding it.
    """

    dims: tuple[tuple[str, ...], ...]
    batch_axes: tuple[tuple[str, int], ...]
    dtype: str
    compute_dtype: str | None = None

    @property
    def devices(self) -> int:
        """Batch devices (``D``)."""
        return math.prod(size for _, size in self.batch_axes)

    @property
    def sharded_axes(self) -> tuple[str, ...]:
        """The mesh axes the weight is split over, in dimension order."""
        return tuple(axis for axes in self.dims for axis in axes)

    @property
    def replicated_axes(self) -> tuple[str, ...]:
        """The batch axes the weight is whole over, in mesh order."""
        return tuple(name for name, size in self.batch_axes if size > 1 and name not in self.sharded_axes)

    def gather(self, shard: jax.Array) -> jax.Array:
        """The whole weight (in ``compute_dtype``) from this device's ``shard``; its gradient is the sum of
        every batch device's, in the canonical tree, on this device's shard (see the module)."""
        return _gathered(self, shard)

    def shard_shape(self, whole: tuple[int, ...]) -> tuple[int, ...]:
        """A device's shard shape of a weight of shape ``whole``."""
        sizes = dict(self.batch_axes)
        return tuple(n // math.prod(sizes[a] for a in axes) for n, axes in zip(whole, self.dims, strict=True))


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gathered(weight: ShardedWeight, shard: jax.Array) -> jax.Array:
    whole = shard if weight.compute_dtype is None else shard.astype(weight.compute_dtype)
    for dim, axes in enumerate(weight.dims):
        if axes:
            whole = jax.lax.all_gather(whole, axes, axis=dim, tiled=True)
    # An opaque value on every mesh, also on one device where nothing is gathered: the layer's program
    # then starts from the same thing whatever the device count.
    return jax.lax.optimization_barrier(whole)


def _gathered_forward(weight: ShardedWeight, shard: jax.Array) -> tuple[jax.Array, None]:
    return _gathered(weight, shard), None


def _gathered_backward(weight: ShardedWeight, _: None, gradient: jax.Array) -> tuple[jax.Array]:
    return (reduce_to_shard(weight, gradient),)


_gathered.defvjp(_gathered_forward, _gathered_backward)


def reduce_to_shard(weight: ShardedWeight, gradient: jax.Array) -> jax.Array:
    """Inside ``shard_map``: every batch device's ``gradient`` of the whole weight added in `tree_sum`'s order
    over the device index, this device's shard of the sum (in ``weight.dtype``).

    Device ``q`` adds the elements of its shard, or of its part of the shard when the weight is whole over
    some batch axes (those parts are then all-gathered). Each device cuts its gradient into the ``D`` pieces
    the devices add (piece ``q`` for device ``q``), an all-to-all hands them out, and the pieces received,
    one from each device in device order, are converted to ``weight.dtype`` and added in the tree.
    """
    gradient = jax.lax.optimization_barrier(gradient)
    sizes = dict(weight.batch_axes)
    shard_shape = weight.shard_shape(gradient.shape)
    split = [(dim, axes) for dim, axes in enumerate(weight.dims) if axes]
    mesh_order = tuple(name for name, size in weight.batch_axes if size > 1)
    if len(split) == 1 and split[0][1] == mesh_order:  # split over every batch axis: no copy first
        dim, axes = split[0]
        by_device = gradient.shape[:dim] + (weight.devices, shard_shape[dim]) + gradient.shape[dim + 1 :]
        # [device j's rows of every device's gradient] -> [device j, my shard]
        pieces = jax.lax.all_to_all(gradient.reshape(by_device), axes, dim, 0)
        return _add_pieces(pieces, weight.dtype)
    # [sizes of each split dimension's mesh axes..., shard dims...]: the mesh coordinates first.
    split_shape: list[int] = []
    mesh_dims: list[int] = []
    shard_dims: list[int] = []
    for local, axes in zip(shard_shape, weight.dims, strict=True):
        for axis in axes:
            mesh_dims.append(len(split_shape))
            split_shape.append(sizes[axis])
        shard_dims.append(len(split_shape))
        split_shape.append(local)
    pieces = gradient.reshape(split_shape).transpose(mesh_dims + shard_dims)
    shard_size = math.prod(shard_shape)
    replicated = weight.replicated_axes
    parts = math.prod(sizes[a] for a in replicated)
    pieces = pieces.reshape(-1, shard_size)
    pieces = jnp.pad(pieces, ((0, 0), (0, -shard_size % parts)))
    # [split axes..., replicated axes..., piece] -> the batch axes in mesh order -> [D, piece].
    by_axis = weight.sharded_axes + replicated
    pieces = pieces.reshape([sizes[a] for a in by_axis] + [-1])
    pieces = pieces.transpose([by_axis.index(a) for a in mesh_order] + [len(by_axis)])
    pieces = pieces.reshape(weight.devices, -1)
    if weight.devices > 1:
        # Row j: device j's piece for this device (device j ran slice t * D + j).
        pieces = jax.lax.all_to_all(pieces, mesh_order, 0, 0)
    summed = _add_pieces(pieces, weight.dtype)
    if replicated:
        summed = jax.lax.all_gather(summed, replicated, tiled=True)
    return summed[:shard_size].reshape(shard_shape)


def _add_pieces(pieces: jax.Array, dtype: str) -> jax.Array:
    """``pieces [D, ...]`` converted to ``dtype`` and added in the tree's order over the device index; the
    barrier keeps the adds apart from the exchange (XLA may not merge them into a reduction of its own)."""
    return tree_sum_in_one_pass(jax.lax.optimization_barrier(pieces).astype(dtype))
