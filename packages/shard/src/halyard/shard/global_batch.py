"""From each process's rows of a batch to one global, sharded `jax.Array`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from halyard.named import NamedArray
from halyard.shard.layout import Layout
from halyard.shard.mesh import BATCH_AXES, mesh_axis_sizes

BATCH = "batch"


def _is_named(x: Any) -> bool:
    return isinstance(x, NamedArray)


def default_batch_axes(mesh: jax.sharding.Mesh, layout: Layout | None = None) -> tuple[str, ...]:
    """The mesh axes the batch splits over: the layout's preferred ones for ``batch``, else the mesh's
    batch axes (`BATCH_AXES`), leaving out axes of size 1."""
    if layout is not None:
        return layout.mesh_axes_for(BATCH, mesh)
    sizes = mesh_axis_sizes(mesh)
    return tuple(a for a in BATCH_AXES if sizes.get(a, 1) > 1)


def _local_batch_blocks(mesh: jax.sharding.Mesh, batch_axes: Sequence[str]) -> int:
    """How many distinct blocks of batch rows this process's devices hold."""
    positions = {idx: device for idx, device in np.ndenumerate(mesh.devices)}
    local = {d.id for d in mesh.local_devices}
    columns = [mesh.axis_names.index(a) for a in batch_axes]
    return len({tuple(idx[c] for c in columns) for idx, device in positions.items() if device.id in local})


def batch_share(
    mesh: jax.sharding.Mesh, layout: Layout | None = None, *, batch_axes: Sequence[str] | None = None
) -> tuple[int, int]:
    """``(index, count)``: this process loads the ``index``-th of ``count`` equal consecutive slices of
    each global batch, the rows its devices hold.

    The batch splits over the batch mesh axes only: processes whose devices hold the same rows (when
    another axis, ``sequence`` or ``tensor``, spans the processes) load the same slice, and a batch that
    no batch axis splits across processes is loaded whole by every process (``count`` 1).

    Raises:
        ValueError: the processes' rows are not equal consecutive slices (a mesh `MeshSpec` did not build).
    """
    axes = tuple(batch_axes) if batch_axes is not None else default_batch_axes(mesh, layout)
    columns = [mesh.axis_names.index(a) for a in axes]
    shape = [mesh.devices.shape[c] for c in columns]
    held: dict[int, set[int]] = {}
    for index, device in np.ndenumerate(mesh.devices):
        block = int(np.ravel_multi_index([index[c] for c in columns], shape)) if columns else 0
        held.setdefault(device.process_index, set()).add(block)
    slices = sorted({tuple(sorted(blocks)) for blocks in held.values()})
    for blocks in slices:
        if len(blocks) != len(slices[0]) or blocks != tuple(range(blocks[0], blocks[0] + len(blocks))):
            raise ValueError(
                f"the batch mesh axes {axes} give the processes rows that are not equal consecutive slices "
                f"({[list(b) for b in slices]}); build the mesh with MeshSpec"
            )
    return slices.index(tuple(sorted(held[jax.process_index()]))), len(slices)


def global_batch_from_local(
    local_rows: Any,
    mesh: jax.sharding.Mesh,
    *,
    layout: Layout | None = None,
    batch_axes: Sequence[str] | None = None,
) -> Any:
    """Assemble global arrays from the rows of the batch this process loaded.

    Every process calls it with its own rows (process p's rows are the p-th block of the global batch
    when the batch axes span processes, which is how `MeshSpec` orders devices). Plain array leaves have
    the batch as their first dimension; `NamedArray` leaves have an axis named ``"batch"`` anywhere.
    Other dimensions are replicated.

    Args:
        local_rows: a pytree (an array, a dict of arrays, NamedArrays) of this process's rows.
        mesh: the mesh (built from every process's devices).
        layout: when given, the batch splits over the layout's preferred mesh axes for ``batch``.
        batch_axes: the mesh axes to split the batch over, overriding both defaults.

    Returns:
        The same tree with global ``jax.Array`` leaves (NamedArrays keep their axes, with the global
        batch size).

    Raises:
        ValueError: when this process's rows do not split evenly over its devices along the batch axes,
            or a NamedArray leaf has no ``batch`` axis.
    """
    axes = tuple(batch_axes) if batch_axes is not None else default_batch_axes(mesh, layout)
    unknown = [a for a in axes if a not in mesh.axis_names]
    if unknown:
        raise ValueError(
            f"global_batch_from_local: mesh axes {unknown} are not in the mesh {mesh.axis_names}"
        )
    entry = None if not axes else axes[0] if len(axes) == 1 else axes
    blocks = _local_batch_blocks(mesh, axes)
    sizes = mesh_axis_sizes(mesh)

    def assemble(array: Any, batch_dim: int, where: str) -> jax.Array:
        array = np.asarray(array)
        rows = array.shape[batch_dim]
        if rows % blocks:
            split = " * ".join(f"{a}={sizes[a]}" for a in axes)
            raise ValueError(
                f"{where}: this process has {rows} batch rows, which do not split over its {blocks} blocks of "
                f"the batch mesh axes ({split}, {math.prod(sizes[a] for a in axes)} in all). Load a "
                f"multiple of {blocks} rows per process (global batch a multiple of "
                f"{math.prod(sizes[a] for a in axes)})"
            )
        spec = PartitionSpec(*[entry if d == batch_dim else None for d in range(array.ndim)])
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), array)

    def convert(path: Any, leaf: Any) -> Any:
        where = "global_batch_from_local " + (
            jax.tree_util.keystr(path, simple=True, separator=".") or "<root>"
        )
        if isinstance(leaf, NamedArray):
            if not leaf.has_axis(BATCH):
                raise ValueError(f"{where}: NamedArray {leaf.axes} has no {BATCH!r} axis to split")
            batch_dim = leaf.axis_index(BATCH)
            array = assemble(leaf.array, batch_dim, where)
            resized = tuple(
                a.resize(array.shape[i]) if i == batch_dim else a for i, a in enumerate(leaf.axes)
            )
            return NamedArray(array, resized)
        if np.ndim(leaf) == 0:
            raise ValueError(f"{where}: a scalar has no batch dimension; batch leaves need rows first")
        return assemble(leaf, 0, where)

    return jax.tree_util.tree_map_with_path(convert, local_rows, is_leaf=_is_named)
