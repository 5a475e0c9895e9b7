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
- norms (the gradient norm for clipping and the logs, the parameter and update norms) add fixed chunks of
  each leaf in fixed trees (`canonical_norm`), each device its share of the chunks;
- the optimizer's update runs where the weights are (each FSDP device its shard) between barriers
  (`isolated`): an elementwise optimizer (AdamW, Lion) rounds the same on a shard as on the whole leaf.
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


def isolated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` between optimization barriers, so XLA cannot fold its arithmetic into what comes before or after.

    The update then runs on each device's shard (FSDP) or on whole leaves (1 device, data parallel) with the
    same bits: elementwise arithmetic rounds the same on a shard as on the whole leaf. Without the barriers
    (and the step's barrier after the division by the token count) XLA simplified the division, the
    clipping and AdamW differently in a shard's program and in a whole leaf's, and an fsdp-8 run parted from
    1 device's at step 1 in a third of the second moments' elements.
    """

    def between_barriers(*args: Any) -> Any:
        return jax.lax.optimization_barrier(fn(*jax.lax.optimization_barrier(args)))

    return between_barriers


NORM_CHUNK = 1024
"""Elements per chunk of the canonical norm: each chunk's squares are added in a fixed pairwise tree."""


def canonical_norm(tree: Any, split: CanonicalSlices) -> jax.Array:
    """The global L2 norm of ``tree`` (float32) in a fixed order, the same bits however the leaves are sharded.

    Each leaf, flattened and padded with zeros, is cut into chunks of `NORM_CHUNK` elements, and the chunks
    are dealt out evenly over the batch devices. Each device adds the squares of its chunks, each in a fixed
    tree (`_chunk_sums`); the chunk sums are gathered and added in `tree_sum`'s order over the chunk index, and
    the leaves' sums in tree order. Padding only appends zero chunks, which leave every partial sum of the
    tree unchanged, so the device count does not show. The leaves enter whole (an FSDP leaf is gathered, as
    for the forward pass): reshaping a sharded leaf into chunks let XLA's sharding choices reach back into
    the update that made it, and an fsdp-8 run's decayed weights parted from 1 device's at step 1.
    """
    leaves = jax.tree_util.tree_leaves(tree)
    devices, axes = split.batch_devices, split.batch_axes

    def my_chunks(leaf: jax.Array) -> jax.Array:
        flat = leaf.reshape(-1)
        flat = jnp.pad(flat, (0, -flat.size % (NORM_CHUNK * devices)))
        count = flat.size // (NORM_CHUNK * devices)
        first = jax.lax.axis_index(axes) * count * NORM_CHUNK if axes else 0
        return jax.lax.dynamic_slice_in_dim(flat, first, count * NORM_CHUNK).reshape(count, NORM_CHUNK)

    def per_device(whole: list[jax.Array]) -> jax.Array:
        chunks = [jnp.square(my_chunks(x).astype(jnp.float32)) for x in whole]
        local = _chunk_sums(jnp.concatenate(chunks))  # every leaf's chunks in one tree of levels
        gathered = jax.lax.all_gather(local, axes) if axes else local[None]
        total = jnp.zeros((), jnp.float32)
        start = 0
        for count in (x.shape[0] for x in chunks):  # device d holds chunks d * count to (d + 1) * count - 1
            total = total + tree_sum(gathered[:, start : start + count].reshape(-1))
            start += count
        return jnp.sqrt(total)

    whole_leaves = PartitionSpec()
    return jax.shard_map(
        per_device, mesh=split.mesh, in_specs=(whole_leaves,), out_specs=PartitionSpec(), check_vma=False
    )(leaves)


def _chunk_sums(chunks: jax.Array, parts: int = 32) -> jax.Array:
    """``[n, width] -> [n]``: each row's sum in a fixed order that does not depend on ``n``: the row is cut
    into ``parts`` equal parts (fewer when narrower), which are added elementwise in `tree_sum`'s pairwise
    order, and again until one element is left; ``width`` and ``parts`` are powers of two."""
    while chunks.shape[1] > 1:
        count = min(parts, chunks.shape[1])
        pieces = chunks.reshape(chunks.shape[0], count, -1)
        level = [pieces[:, index] for index in range(count)]
        while len(level) > 1:  # a power of two: adjacent pairs, level by level, in one fused loop
            level = [level[index] + level[index + 1] for index in range(0, len(level), 2)]
        chunks = jax.lax.optimization_barrier(level[0])
    return chunks[:, 0]


def clip_to_norm(grads: Any, norm: jax.Array, max_norm: float) -> Any:
    """``grads`` scaled to L2 norm ``max_norm`` when their ``norm`` is above it (optax's
    ``clip_by_global_norm`` with a given norm); elementwise, so the same bits on any sharding."""
    keep = norm < max_norm
    return jax.tree_util.tree_map(
        lambda g: jnp.where(keep, g, (g / norm.astype(g.dtype)) * jnp.asarray(max_norm, g.dtype)), grads
    )
