"""Create parameters directly in their target sharding, so no device ever holds the whole model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from halyard.shard.layout import Layout


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray)


def init_sharded(
    init_fn: Callable[..., Any], layout: Layout, mesh: jax.sharding.Mesh, *args: Any, **kwargs: Any
) -> Any:
    """Call ``init_fn(*args, **kwargs)`` under ``jax.jit`` with ``out_shardings`` from ``layout``.

    The output's shapes come from ``jax.eval_shape`` first (nothing is computed), the layout places every
    leaf, and the jitted initializer writes each device's slice directly: a model larger than one
    device's memory is never materialized whole.

    Args:
        init_fn: returns a pytree of NamedArrays (and plain arrays, replicated), e.g. ``model.init``.
        layout: where the weights go (its ``min_shard`` and ``tolerance`` apply).
        mesh: the mesh.
        *args, **kwargs: passed to ``init_fn``; array arguments (a PRNG key) are traced, everything else
            (configs, ints, axes) is passed as a Python constant.

    Raises:
        ValueError: from `Layout.shardings` when the layout leaves too much replicated, before compiling.
    """
    leaves, treedef = jax.tree.flatten((args, kwargs))
    traced = [_is_array(leaf) for leaf in leaves]

    def call(*arrays: Any) -> Any:
        remaining = iter(arrays)
        rebuilt = [next(remaining) if is_traced else leaf for leaf, is_traced in zip(leaves, traced)]
        call_args, call_kwargs = jax.tree.unflatten(treedef, rebuilt)
        return init_fn(*call_args, **call_kwargs)

    arrays = [leaf for leaf, is_traced in zip(leaves, traced) if is_traced]
    shapes = jax.eval_shape(call, *arrays)
    return jax.jit(call, out_shardings=layout.shardings(shapes, mesh))(*arrays)
