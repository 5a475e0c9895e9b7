"""The invariant step's norms: the global L2 norm of a tree in fixed chunks added in fixed trees, from the
leaves' shards, with the same bits on any mesh."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from halyard.shard import BATCH_AXES, mesh_axis_sizes
from halyard.train.invariant.gathers import ShardedWeight
from halyard.train.invariant.slices import CanonicalSlices
from halyard.train.invariant.trees import tree_sum
from halyard.train.invariant.view import sharded_weights

NORM_CHUNK = 1024
"""Elements per chunk of the canonical norm: each chunk's squares are added in a fixed pairwise tree."""


def canonical_norm(tree: Any, split: CanonicalSlices) -> jax.Array:
    """The global L2 norm of ``tree`` (float32) in a fixed order, the same bits however the leaves are sharded.

    Each leaf, flattened, is cut into chunks of `NORM_CHUNK` elements (the last one padded with zeros). Each
    chunk's squares are added in a fixed tree (`_chunk_sums`), the chunk sums in `tree_sum`'s order over the
    chunk index, and the leaves' sums in leaf order. Each device adds the chunks of its shard (``split.layout``)
    where each of the shard's rows holds whole chunks (an FSDP shard of a layer stack: nothing moves); a shard
    whose rows do not is first exchanged into one run of the flattened leaf per device (an all-to-all, the
    traffic of a reduce-scatter: nothing is gathered whole); a whole leaf's chunks are dealt out over the
    batch devices. Zero chunks appended for an even share change no partial sum of the tree (an odd last
    element is carried up unchanged, as if added to zeros), so the device count does not show.
    """
    leaves = jax.tree_util.tree_leaves(tree)
    weights = sharded_weights(tree, split.mesh, split.layout)
    if weights is None:
        sizes = mesh_axis_sizes(split.mesh)
        batch_axes = tuple((name, sizes[name]) for name in split.mesh.axis_names if name in BATCH_AXES)
        weights = [
            ShardedWeight(((),) * leaf.ndim, batch_axes, jnp.dtype(leaf.dtype).name) for leaf in leaves
        ]
    else:
        weights = jax.tree_util.tree_leaves(weights, is_leaf=lambda x: isinstance(x, ShardedWeight))

    def per_device(shards: list[jax.Array]) -> jax.Array:
        parts = [_my_chunks(shard, weight) for shard, weight in zip(shards, weights, strict=True)]
        # Leaves whose chunks are dealt over the same devices: their chunk sums in one all-gather, then each
        # leaf's put back in the order of its flattened elements.
        leaf_sums: dict[int, jax.Array] = {}
        for owners in dict.fromkeys(owners for _, owners, _ in parts):
            members = [index for index, part in enumerate(parts) if part[1] == owners]
            sums = [_chunk_sums(jnp.square(parts[index][0].astype(jnp.float32))) for index in members]
            local = jnp.concatenate(sums)
            gathered = jax.lax.all_gather(local, owners) if owners else local[None]
            start = 0
            for index, count in zip(members, (x.shape[0] for x in sums), strict=True):
                runs = parts[index][2]  # [devices, runs * c] -> [runs, devices, c]: the flattened order
                mine = gathered[:, start : start + count]
                ordered = mine.reshape(mine.shape[0], runs, -1).swapaxes(0, 1).reshape(-1)
                leaf_sums[index] = tree_sum(ordered)
                start += count
        total = jnp.zeros((), jnp.float32)
        for index in range(len(parts)):
            total = total + leaf_sums[index]
        return jnp.sqrt(total)

    specs = [PartitionSpec(*(axes or None for axes in weight.dims)) for weight in weights]
    return jax.shard_map(
        per_device, mesh=split.mesh, in_specs=(specs,), out_specs=PartitionSpec(), check_vma=False
    )(leaves)


def _my_chunks(shard: jax.Array, weight: ShardedWeight) -> tuple[jax.Array, tuple[str, ...], int]:
    """``(this device's chunks of the leaf [count, NORM_CHUNK], the mesh axes the chunks are dealt over, runs)``.

    The leaf, flattened, is ``runs`` rows of equal runs, one run per device along those axes (in their
    linear order) in each row: a leaf split along a dimension whose shards hold whole chunks per row (``runs``
    rows before that dimension, no exchange), split otherwise but exchanged into one run per device (an
    all-to-all), or whole and dealt out in zero-padded runs. The other batch devices hold copies.
    """
    sizes = dict(weight.batch_axes)
    whole = tuple(
        n * math.prod(sizes[a] for a in axes) for n, axes in zip(shard.shape, weight.dims, strict=True)
    )
    split = [(dim, axes) for dim, axes in enumerate(weight.dims) if axes]
    owners: tuple[str, ...] = ()
    runs = 1
    if len(split) == 1:
        dim, axes = split[0]
        parts, rows = math.prod(sizes[a] for a in axes), math.prod(whole[:dim])
        if math.prod(shard.shape[dim:]) % NORM_CHUNK == 0:  # each row's run holds whole chunks
            owners, runs = axes, rows
        elif rows % parts == 0 and math.prod(whole) // parts % NORM_CHUNK == 0:
            owners = axes  # [rows, my columns] -> [my rows, all columns]: one run of the flattened leaf
            shard = jax.lax.all_to_all(shard.reshape(rows, -1), axes, 0, 1, tiled=True)
    if (
        split and not owners
    ):  # an odd split: this leaf is gathered whole (none of the built-in layouts makes one)
        for dim, axes in split:
            shard = jax.lax.all_gather(shard, axes, axis=dim, tiled=True)
    flat = shard.reshape(-1)
    if not owners:  # whole: each batch device takes an equal run of chunks
        owners = tuple(name for name, size in weight.batch_axes if size > 1)
        sharing = math.prod(sizes[a] for a in owners)
        flat = jnp.pad(flat, (0, -flat.size % (NORM_CHUNK * sharing)))
        if sharing > 1:
            size = flat.size // sharing
            flat = jax.lax.dynamic_slice_in_dim(flat, jax.lax.axis_index(owners) * size, size)
    return flat.reshape(-1, NORM_CHUNK), owners, runs


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
