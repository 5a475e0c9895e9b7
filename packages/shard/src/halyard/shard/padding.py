"""Sizes that must divide over mesh axes: round them up (`pad_for`) or fail before compiling."""

from __future__ import annotations

import math

import jax

from halyard.shard.layout import Layout
from halyard.shard.mesh import mesh_axis_sizes


def _split_count(axis_name: str, mesh: jax.sharding.Mesh, layout: Layout) -> tuple[tuple[str, ...], int]:
    mesh_axes = layout.mesh_axes_for(axis_name, mesh)
    sizes = mesh_axis_sizes(mesh)
    return mesh_axes, math.prod(sizes[a] for a in mesh_axes)


def pad_for(size: int, axis_name: str, mesh: jax.sharding.Mesh, layout: Layout) -> int:
    """The smallest size >= ``size`` that divides over the mesh axes ``layout`` means ``axis_name`` for.

    E.g. a GPT-2 vocabulary of 50257 on ``tensor=8`` under `Layout.tensor_parallel` becomes 50264.

    Args:
        size: the logical axis' natural size (elements).
        axis_name: the logical axis name (``"vocab"``).
        mesh: the mesh.
        layout: the layout whose first effective candidate for ``axis_name`` decides the mesh axes.

    Raises:
        ValueError: when ``size`` is negative or a rule names a mesh axis the mesh lacks.
    """
    if size < 0:
        raise ValueError(f"pad_for: size of {axis_name!r} must be non-negative, got {size}")
    _, count = _split_count(axis_name, mesh, layout)
    return -(-size // count) * count


def check_divisible(size: int, axis_name: str, mesh: jax.sharding.Mesh, layout: Layout) -> None:
    """Fail before compiling when ``size`` does not divide over the mesh axes meant for ``axis_name``.

    Args:
        size: the axis' size.
        axis_name: the logical axis name (``"vocab"``, ``"batch"``).
        mesh: the mesh.
        layout: the layout whose preferred mesh axes for ``axis_name`` are checked.

    Raises:
        ValueError: "Axis 'vocab' has size 50257, which does not divide over mesh axes ('tensor',) of
            8 devices (tensor=8). Use pad_for(50257, 'vocab', mesh, layout) = 50264 ..."
    """
    mesh_axes, count = _split_count(axis_name, mesh, layout)
    if size % count:
        sizes = mesh_axis_sizes(mesh)
        spelled = " * ".join(f"{a}={sizes[a]}" for a in mesh_axes)
        padded = -(-size // count) * count
        raise ValueError(
            f"Axis {axis_name!r} has size {size}, which does not divide over mesh axes {mesh_axes} of "
            f"{count} devices ({spelled}) under layout {layout.name!r}. Use "
            f"pad_for({size}, {axis_name!r}, mesh, layout) = {padded} as the size (padding the extra "
            f"entries), or choose a mesh whose {'/'.join(mesh_axes)} size divides {size}"
        )
