"""`LeafPlacement`: how one leaf of a pytree is placed on a mesh (what a `Layout` plans, what its report
and its tolerance check read)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec

from halyard.named import Axis
from halyard.shard.rules import DimPlacement


@dataclass(frozen=True)
class LeafPlacement:
    """How one leaf of a pytree is placed (what `Layout.describe` prints and the tolerance check counts).

    Attributes:
        path: the leaf's path in the tree, dotted (``blocks.attn.q``).
        axes: its named axes; ``None`` for a plain array (replicated unless already annotated).
        shape, dtype: global shape and dtype.
        spec: the `PartitionSpec`.
        dims: per-dimension placement (empty for plain arrays).
        why: when a rule wanted this leaf split but it stayed replicated, the reason.
        shardable: whether the rules would split it on this mesh (what ``tolerance`` is measured over).
    """

    path: str
    axes: tuple[Axis, ...] | None
    shape: tuple[int, ...]
    dtype: Any
    spec: PartitionSpec
    dims: tuple[DimPlacement, ...] = ()
    why: str = ""
    shardable: bool = False

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def replicated(self) -> bool:
        return all(entry is None for entry in self.spec)

    def bytes_per_device(self, mesh_sizes: Mapping[str, int]) -> int:
        """Bytes one device holds of this leaf."""
        split = math.prod(
            mesh_sizes[a] for entry in self.spec if entry is not None for a in _entry_axes(entry)
        )
        return self.num_elements * np.dtype(self.dtype).itemsize // split


def _entry_axes(entry: Any) -> tuple[str, ...]:
    return (entry,) if isinstance(entry, str) else tuple(entry)
