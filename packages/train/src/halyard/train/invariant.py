"""The invariant step's arithmetic: the same bits on any split of the batch over the data-like mesh axes.

A sum whose operands are split over devices is, by default, a local partial sum per device followed by an
all-reduce, so its rounding depends on how many devices there are. Here every reduction that crosses
rows of the batch has a fixed shape and a fixed order that the config alone decides:

- the batch is cut into ``slices`` canonical slices of equal rows (a power of two); each slice's loss and
  gradient is one iteration of the same scanned computation, on a device that holds the whole slice and
  every weight (so no contraction is split over devices);
- slice results are added in one pairwise tree over the slice index (adjacent pairs, level by level).
  A device holds a contiguous block of slices, a power of two of them, so the tree's lower levels are its
  own and the upper levels combine whole device blocks: the same tree on 1 device or on 64;
- norms (the gradient norm for clipping and the logs, the parameter and update norms) and the optimizer's
  update are computed on whole, gathered leaves (`on_whole_leaves`), so an elementwise optimizer (AdamW,
  Lion) runs the same loops on the same numbers on any sharding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from halyard.shard import BATCH_AXES, mesh_axis_sizes, without_layout

SliceTerm = Callable[..., Any]
"""``(params, batch, key, frozen) -> pytree of sums``."""


@dataclass(frozen=True)
class CanonicalSlices:
    """How the invariant step cuts a (micro)batch and where it runs.

    Args:
        mesh: the run's mesh; only its batch axes (replica, data, fsdp, expert) may be larger than 1.
        slices: canonical slices per (micro)batch, a power of two that the batch devices divide.
        max_grad_norm: clip the gradients to this canonical global norm (None: no clipping).
    """

    mesh: jax.sharding.Mesh
    slices: int
    max_grad_norm: float | None = None

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The mesh axes the slices are spread over, in mesh order."""
        return tuple(name for name in self.mesh.axis_names if name in BATCH_AXES)

    @property
    def batch_devices(self) -> int:
        """Devices the slices are spread over (the product of the batch axes' sizes)."""
        sizes = mesh_axis_sizes(self.mesh)
        return math.prod(sizes[name] for name in self.batch_axes)


def tree_sum(stacked: Any) -> Any:
    """Sum every leaf of ``stacked`` over its leading axis ``[n, ...]`` in a fixed pairwise tree: adjacent
    pairs ``(0, 1), (2, 3), ...`` first, then pairs of those, an odd last element carried up unchanged."""

    def one(x: jax.Array) -> jax.Array:
        while x.shape[0] > 1:
            count = x.shape[0]
            pairs = x[: count - count % 2].reshape((count // 2, 2) + x.shape[1:])
            summed = pairs[:, 0] + pairs[:, 1]
            x = jnp.concatenate([summed, x[count - 1 :]]) if count % 2 else summed
            # One level at a time: XLA would otherwise be free to turn the levels into one reduction in
            # its own order (the GPT-2 benchmark's step-3 loss parted by a bit on 8 devices from 1 device's).
            x = jax.lax.optimization_barrier(x)
        return x[0]

    return jax.tree_util.tree_map(one, stacked)


def scan_tree_sum(term: Callable[[jax.Array, Any], Any], count: int, inputs: Any) -> Any:
    """``sum(term(i, inputs[i]) for i < count)`` in `tree_sum`'s order, as a scan holding
    ``log2(count) + 1`` partial sums instead of ``count`` terms.

    ``count`` is a power of two. Term ``i`` closes the pairs it completes (as many as ``i``'s trailing
    one bits: term 3 adds itself to term 2, then that to terms 0 + 1) and waits at the level it reached.
    """
    levels = count.bit_length()
    shapes = jax.eval_shape(term, jnp.zeros((), jnp.int32), jax.tree_util.tree_map(lambda x: x[0], inputs))
    empty = jax.tree_util.tree_map(lambda s: jnp.zeros((levels, *s.shape), s.dtype), shapes)

    def add(waiting: Any, step: tuple[jax.Array, Any]) -> tuple[Any, None]:
        index, item = step
        value = term(index, item)
        closes = jax.lax.population_count(index ^ (index + 1)) - 1  # trailing one bits of index
        for level in range(levels - 1):
            value = jax.tree_util.tree_map(
                lambda w, v, level=level: jnp.where(level < closes, w[level] + v, v), waiting, value
            )
        waiting = jax.tree_util.tree_map(
            lambda w, v: jax.lax.dynamic_update_index_in_dim(w, v, closes, 0), waiting, value
        )
        return waiting, None

    waiting, _ = jax.lax.scan(add, empty, (jnp.arange(count, dtype=jnp.int32), inputs))
    return jax.tree_util.tree_map(lambda w: w[levels - 1], waiting)


def sliced_sums(term: SliceTerm, split: CanonicalSlices) -> SliceTerm:
    """``term`` summed over a batch's canonical slices, in the canonical order, the sums on every device.

    Args:
        term: ``(params, slice rows, key, frozen) -> pytree of sums`` of one slice (a loss sum and its
            token count; with gradients for the train step).
        split: the slice count and the mesh. Slice ``i`` (rows ``i * R`` to ``(i + 1) * R`` of a batch of
            ``slices * R`` rows) gets the key ``fold_in(key, i)``.

    Returns:
        The same signature for a whole batch ``[slices * R, ...]`` whose rows are split over the batch axes.
    """
    axes = split.batch_axes
    local_slices = split.slices // split.batch_devices

    def per_device(params: Any, batch: dict[str, jax.Array], key: jax.Array, frozen: Any) -> Any:
        first = jax.lax.axis_index(axes) * local_slices if axes else 0
        rows = jax.tree_util.tree_map(lambda x: x.reshape((local_slices, -1) + x.shape[1:]), batch)

        def one_slice(index: jax.Array, slice_rows: dict[str, jax.Array]) -> Any:
            # Barriers keep the slice's program whole: with one slice a device XLA drops the loop and would
            # fuse its last reductions with what follows (the loss of a step parted in the last bit).
            inputs = jax.lax.optimization_barrier(
                (params, slice_rows, jax.random.fold_in(key, first + index))
            )
            return jax.lax.optimization_barrier(term(*inputs, frozen))

        # The model's activation constraints name mesh axes; here each array is already one device's.
        with without_layout():
            block_sum = scan_tree_sum(one_slice, local_slices, rows)
        return jax.tree_util.tree_map(lambda x: _sum_over_devices(x, axes, split.batch_devices), block_sum)

    sharded = jax.shard_map(
        per_device,
        mesh=split.mesh,
        in_specs=(PartitionSpec(), PartitionSpec(axes), PartitionSpec(), PartitionSpec()),
        out_specs=PartitionSpec(),
        check_vma=False,
    )

    def sums(params: Any, batch: dict[str, jax.Array], key: jax.Array, frozen: Any = None) -> Any:
        return sharded(params, batch, key, frozen)

    return sums


SMALLEST_EXCHANGED = 1024
"""Block sums of fewer elements a device are gathered whole; larger ones are exchanged by element."""


def _sum_over_devices(block: jax.Array, axes: tuple[str, ...], devices: int) -> jax.Array:
    """Inside `shard_map`: the devices' block sums added in `tree_sum`'s order over the device index, the
    result on every device.

    A large block is exchanged by element first (an all-to-all: the traffic of a reduce-scatter), so each
    device adds its ``1 / devices`` of the elements of every block, and the sums are then gathered (the
    traffic of an all-gather). Each element sees the same adds in the same order as when every device
    gathers every block whole: elementwise adds round the same whatever the elements around them.
    """
    if devices == 1:
        return block
    if block.size < SMALLEST_EXCHANGED:
        return tree_sum(jax.lax.all_gather(block, axes))
    flat = block.reshape(-1)
    flat = jnp.pad(flat, (0, -flat.size % devices)).reshape(devices, -1)
    # Row j of ``mine``: device j's block at this device's share of the elements.
    mine = jax.lax.all_to_all(flat, axes, 0, 0)
    summed = jax.lax.all_gather(tree_sum(jax.lax.optimization_barrier(mine)), axes, tiled=True)
    return summed[: block.size].reshape(block.shape)


def on_whole_leaves(fn: Callable[..., Any], mesh: jax.sharding.Mesh) -> Callable[..., Any]:
    """``fn`` run on every device with whole (gathered) arguments, its results replicated.

    Elementwise arithmetic compiled for a shard does not always round like the same arithmetic compiled
    for the whole leaf (XLA fuses and vectorizes each program its own way): AdamW's update of an FSDP
    shard differed in the last bit from the whole leaf's, with equal gradients and moments. On whole
    leaves every mesh compiles the same loops for the same numbers; each device computes all of it (the
    price). The optimization barriers keep XLA from moving the slicing to each device's shard, which
    follows, back into ``fn`` (it did, and the bits parted again on the benchmark model).
    """

    def whole(*args: Any) -> Any:
        # The barrier keeps XLA from moving the slicing to each device's shard (which follows) into ``fn``.
        return jax.lax.optimization_barrier(fn(*jax.lax.optimization_barrier(args)))

    replicated = PartitionSpec()
    return jax.shard_map(whole, mesh=mesh, in_specs=replicated, out_specs=replicated, check_vma=False)


def canonical_norm(tree: Any, mesh: jax.sharding.Mesh) -> jax.Array:
    """The global L2 norm of ``tree`` (float32), each leaf's squares summed whole on every device, the
    leaves' sums added in tree order: the same bits however the leaves are sharded."""

    def norm(leaves: list[jax.Array]) -> jax.Array:
        total = jnp.zeros((), jnp.float32)
        for leaf in leaves:
            total = total + jnp.sum(jnp.square(leaf.astype(jnp.float32)))
        return jnp.sqrt(total)

    return on_whole_leaves(norm, mesh)(jax.tree_util.tree_leaves(tree))


def clip_to_norm(grads: Any, norm: jax.Array, max_norm: float) -> Any:
    """``grads`` scaled to L2 norm ``max_norm`` when their ``norm`` is above it (optax's
    ``clip_by_global_norm`` with a given norm); elementwise, so the same bits on any sharding."""
    keep = norm < max_norm
    return jax.tree_util.tree_map(
        lambda g: jnp.where(keep, g, (g / norm.astype(g.dtype)) * jnp.asarray(max_norm, g.dtype)), grads
    )
