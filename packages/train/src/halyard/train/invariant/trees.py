"""The invariant step's one order of addition: a pairwise tree over an index (slices, devices, chunks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


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


def tree_sum_in_one_pass(rows: jax.Array) -> jax.Array:
    """`tree_sum` of ``rows [n, ...]`` over the leading axis, its adds written out row by row: XLA fuses them
    into one loop that reads each row once and adds as written (the levels apart read and write every level's
    partial sums). For rows that an optimization barrier keeps apart from whatever made them."""
    level = [rows[index] for index in range(rows.shape[0])]
    while len(level) > 1:
        odd = [level[-1]] if len(level) % 2 else []
        level = [level[index] + level[index + 1] for index in range(0, len(level) - 1, 2)] + odd
    return level[0]


def scan_tree_sum(term: Callable[[jax.Array, Any], Any], count: int, inputs: Any) -> Any:
    """``sum(term(i, inputs[i]) for i < count)`` in `tree_sum`'s order, as a scan holding
    ``log2(count) + 1`` partial sums instead of ``count`` terms.

    ``count`` is a power of two. Term ``i`` closes the pairs it completes (as many as ``i``'s trailing
    one bits: term 3 adds itself to term 2, then that to terms 0 + 1) and waits at the level it reached.
    One term is returned as it is, without a loop or a buffer for it.
    """
    if count == 1:
        return term(jnp.zeros((), jnp.int32), jax.tree_util.tree_map(lambda x: x[0], inputs))
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


SMALLEST_EXCHANGED = 1024
"""Sums of fewer elements a device are gathered whole; larger ones are exchanged by element."""


def sum_over_devices(block: jax.Array, axes: tuple[str, ...], devices: int) -> jax.Array:
    """Inside `shard_map`: the devices' ``block`` sums added in `tree_sum`'s order over the device index
    (the linear index over ``axes``), the result on every device.

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
