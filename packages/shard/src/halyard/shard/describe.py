"""Readable reports of a placement: the `Layout.describe` table and the tolerance refusal message."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import PartitionSpec

from halyard.shard.mesh import mesh_axis_sizes
from halyard.shard.placement import LeafPlacement

_LARGEST_SHOWN = 5


def format_spec(spec: PartitionSpec) -> str:
    """``(-, fsdp)``: one entry per dimension, ``-`` for whole, ``a*b`` for a split over two mesh axes."""
    entries = ["-" if e is None else e if isinstance(e, str) else "*".join(e) for e in spec]
    return "(" + ", ".join(entries) + ")"


def format_bytes(num_bytes: int) -> str:
    """``512 B``, ``2.0 KiB``, ``16.0 MiB``, ``1.5 GiB``."""
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _axes_text(placement: LeafPlacement) -> str:
    if placement.axes is None:
        return "(" + ", ".join(str(s) for s in placement.shape) + ")"
    return "(" + ", ".join(f"{a.name}={a.size}" for a in placement.axes) + ")"


def replicated_share(placements: Sequence[LeafPlacement]) -> tuple[float, int, int]:
    """(share, replicated elements, shardable elements) over the weights the rules would split."""
    shardable = sum(p.num_elements for p in placements if p.shardable)
    replicated = sum(p.num_elements for p in placements if p.shardable and p.replicated)
    return (replicated / shardable if shardable else 0.0), replicated, shardable


def tolerance_error(
    layout_name: str, tolerance: float, placements: Sequence[LeafPlacement], mesh: jax.sharding.Mesh
) -> str:
    """The refusal message when more than ``tolerance`` of the shardable elements stays replicated, else ``""``.

    Args:
        layout_name: the layout's name, for the message.
        tolerance: the largest replicated share allowed (`Layout.tolerance`).
        placements: every leaf's placement (`Layout.plan`).
        mesh: the mesh they are placed on.
    """
    share, replicated, shardable = replicated_share(placements)
    if share <= tolerance:
        return ""
    largest = sorted((p for p in placements if p.shardable and p.replicated), key=lambda p: -p.num_elements)
    lines = [
        f"Layout {layout_name!r} leaves {share:.1%} of the shardable weight elements replicated "
        f"({replicated} of {shardable}) on mesh {mesh_axis_sizes(mesh)}; the tolerance is "
        f"{tolerance:.1%}. Largest replicated weights:"
    ]
    lines += [
        f"  {p.path or '<root>'} {_axes_text(p)}: {p.num_elements} elements; {p.why}"
        for p in largest[:_LARGEST_SHOWN]
    ]
    if len(largest) > _LARGEST_SHOWN:
        lines.append(f"  ... and {len(largest) - _LARGEST_SHOWN} more")
    lines.append(
        "Fix: pad the axes that do not divide (halyard.shard.pad_for), lower min_shard, change the mesh, "
        "or raise the layout's tolerance"
    )
    return "\n".join(lines)


def describe_table(layout_name: str, placements: Sequence[LeafPlacement], mesh: jax.sharding.Mesh) -> str:
    """The `Layout.describe` table: path, axes, spec, dtype, bytes per device, and a summary.

    Args:
        layout_name: the layout's name, for the summary line.
        placements: every leaf's placement (`Layout.plan`).
        mesh: the mesh they are placed on.
    """
    mesh_sizes = mesh_axis_sizes(mesh)
    header = ("path", "axes", "spec", "dtype", "bytes/device", "note")
    rows = [
        (
            p.path or "<root>",
            _axes_text(p),
            format_spec(p.spec),
            str(p.dtype),
            format_bytes(p.bytes_per_device(mesh_sizes)),
            p.why,
        )
        for p in placements
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + ("  " + row[-1] if row[-1] else "")
        for row in [header, *rows]
    ]
    lines = [line.rstrip() for line in lines]
    total = sum(p.num_elements * _itemsize(p) for p in placements)
    per_device = sum(p.bytes_per_device(mesh_sizes) for p in placements)
    share, _, _ = replicated_share(placements)
    mesh_text = ", ".join(f"{name}={size}" for name, size in mesh_sizes.items() if size > 1) or "1 device"
    lines.append(
        f"layout {layout_name}, mesh ({mesh_text}): {format_bytes(total)} in all, "
        f"{format_bytes(per_device)} per device, {share:.1%} of shardable weights replicated"
    )
    return "\n".join(lines)


def _itemsize(placement: LeafPlacement) -> int:
    return np.dtype(placement.dtype).itemsize
