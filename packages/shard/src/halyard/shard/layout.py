"""`Layout`: where every weight and activation lives, from logical axis names to mesh axes."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from halyard.named import Axis, NamedArray
from halyard.shard.describe import describe_table, tolerance_error
from halyard.shard.mesh import BATCH_AXES, mesh_axis_sizes
from halyard.shard.placement import LeafPlacement
from halyard.shard.rules import DimPlacement, Rules, RuleValue, normalize_rules, preferred_mesh_axes, resolve

_BATCH = (BATCH_AXES, ("replica", "data", "fsdp"), ("replica", "data"))
_LAYERS = ("stage",)
_POS = ("sequence",)
# Every ready-made layout starts with these: the batch claims its mesh axes before any weight rule.
_COMMON: list[tuple[str, RuleValue]] = [("batch", _BATCH), ("pos", _POS), ("layers", _LAYERS)]
_TENSOR: list[tuple[str, RuleValue]] = [(n, ("tensor",)) for n in ("heads", "kv_heads", "mlp", "vocab")]
# Weights split over fsdp and sequence together (context parallelism never replicates the model: the
# sequence devices share the weights as fsdp devices do, as torchtitan folds its context axis into FSDP);
# over either alone where the pair does not divide. Activations keep both for the batch and positions.
_SHARDED_WEIGHT: RuleValue = (("fsdp", "sequence"), "fsdp", "sequence")


def _is_named(x: Any) -> bool:
    # A NamedArray around an empty pytree node (optax's MaskedNode, in the state of a masked or
    # multi_transform optimizer such as Muon's) holds no array to place: descend into it, finding no leaf.
    return isinstance(x, NamedArray) and bool(jax.tree_util.tree_leaves(x.array))


def _spec(dims: Sequence[DimPlacement]) -> PartitionSpec:
    entries = [
        None if not d.mesh_axes else d.mesh_axes[0] if len(d.mesh_axes) == 1 else d.mesh_axes for d in dims
    ]
    return PartitionSpec(*entries)


@dataclass(frozen=True)
class Layout:
    """Ordered rules from logical axis names to mesh axes, for weights and activations alike.

    Args:
        rules: ``{logical name: candidates}`` (or a sequence of pairs), in priority order; see
            `halyard.shard.rules` for the candidate grammar and the resolution (first candidate whose mesh
            size divides the dimension and whose mesh axes are still free in that array wins).
        min_shard: weights with fewer elements than this stay replicated (the gather costs more than the
            memory saved). Applies to weights (`shardings`, `place`, `describe`), not to activations.
        tolerance: the largest share of the shardable weight elements (those the rules would split on
            this mesh) that may end up replicated; more is refused by `shardings` / `place` with the
            largest replicated weights and why. ``1.0`` disables the check.

    Raises:
        ValueError / TypeError: for malformed rules or out-of-range ``min_shard`` / ``tolerance``.
    """

    rules: Rules
    min_shard: int = 2**16
    tolerance: float = 0.02
    name: str = field(default="custom", compare=False)

    def __init__(
        self,
        rules: Mapping[str, RuleValue] | Sequence[tuple[str, RuleValue]],
        min_shard: int = 2**16,
        tolerance: float = 0.02,
        name: str = "custom",
    ):
        if not isinstance(min_shard, int) or min_shard < 0:
            raise ValueError(f"Layout min_shard must be a non-negative int (elements), got {min_shard!r}")
        if not 0.0 <= tolerance <= 1.0:
            raise ValueError(f"Layout tolerance must be a share between 0 and 1, got {tolerance!r}")
        object.__setattr__(self, "rules", normalize_rules(rules))
        object.__setattr__(self, "min_shard", min_shard)
        object.__setattr__(self, "tolerance", float(tolerance))
        object.__setattr__(self, "name", name)

    # -- ready-made layouts --------------------------------------------------------------------
    @classmethod
    def data_parallel(cls, min_shard: int = 2**16, tolerance: float = 0.02) -> Layout:
        """Batch split over the batch axes; every weight replicated."""
        return cls(_COMMON, min_shard, tolerance, "data_parallel")

    @classmethod
    def fsdp(cls, min_shard: int = 2**16, tolerance: float = 0.02) -> Layout:
        """Batch split over the batch axes; each weight split over ``fsdp`` (and ``sequence``, see
        `_SHARDED_WEIGHT`) along its first dimension that divides, trying ``embed``, then ``mlp``, heads,
        ``vocab`` (gathered just in time by XLA)."""
        weights = ("embed", "mlp", "heads", "kv_heads", "vocab", "experts", "head_size")
        return cls(_COMMON + [(n, _SHARDED_WEIGHT) for n in weights], min_shard, tolerance, "fsdp")

    @classmethod
    def tensor_parallel(cls, min_shard: int = 2**16, tolerance: float = 0.02) -> Layout:
        """Megatron-style: ``heads``, ``kv_heads``, ``mlp`` and ``vocab`` split over ``tensor``; ``embed``
        whole, so attention and MLP need one reduction each."""
        return cls(_COMMON + _TENSOR, min_shard, tolerance, "tensor_parallel")

    @classmethod
    def fsdp_tensor(cls, min_shard: int = 2**16, tolerance: float = 0.02) -> Layout:
        """Tensor parallel as in `tensor_parallel`, plus ``embed`` split over ``fsdp`` and ``sequence`` (2-D
        sharding)."""
        return cls(_COMMON + _TENSOR + [("embed", _SHARDED_WEIGHT)], min_shard, tolerance, "fsdp_tensor")

    @classmethod
    def expert_parallel(cls, min_shard: int = 2**16, tolerance: float = 0.02) -> Layout:
        """`fsdp_tensor` plus the ``experts`` axis split over ``expert`` (the batch splits over it too)."""
        rules = _COMMON + [("experts", ("expert",))] + _TENSOR + [("embed", _SHARDED_WEIGHT)]
        return cls(rules, min_shard, tolerance, "expert_parallel")

    @classmethod
    def preset(cls, name: str, min_shard: int = 2**16, tolerance: float = 0.02) -> Layout:
        """A ready-made layout by name (for configs): one of `PRESETS`.

        Raises:
            ValueError: for an unknown name, with the closest match.
        """
        if name not in PRESETS:
            close = difflib.get_close_matches(name, PRESETS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"Unknown layout {name!r}; choose one of {PRESETS}.{hint}")
        return getattr(cls, name)(min_shard=min_shard, tolerance=tolerance)

    # -- one array -----------------------------------------------------------------------------
    def placement(self, axes: Sequence[Axis], mesh: jax.sharding.Mesh) -> tuple[DimPlacement, ...]:
        """Per-dimension placement of an array with these axes (rules only; no ``min_shard``)."""
        return resolve(tuple(axes), self.rules, mesh_axis_sizes(mesh))

    def partition_spec(
        self, x: NamedArray | Sequence[Axis], mesh: jax.sharding.Mesh, *, weight: bool = False
    ) -> PartitionSpec:
        """The `PartitionSpec` of a named array (or of arrays with these axes).

        Args:
            x: a `NamedArray` (also one holding a ``ShapeDtypeStruct``), or its axes.
            mesh: the mesh (its axis sizes decide divisibility).
            weight: apply ``min_shard`` (weights below it stay replicated); activations do not.

        Raises:
            ValueError: when a rule names a mesh axis the mesh lacks.
        """
        axes = x.axes if isinstance(x, NamedArray) else tuple(x)
        dims = self.placement(axes, mesh)
        if weight and math.prod(a.size for a in axes) < self.min_shard:
            return PartitionSpec(*([None] * len(axes)))
        return _spec(dims)

    def mesh_axes_for(self, logical_name: str, mesh: jax.sharding.Mesh) -> tuple[str, ...]:
        """The mesh axes a dimension called ``logical_name`` is meant to split over on this mesh (the first
        candidate that shards anything, before divisibility); ``()`` when none."""
        return preferred_mesh_axes(logical_name, self.rules, mesh_axis_sizes(mesh))

    # -- whole trees ---------------------------------------------------------------------------
    def plan(self, tree: Any, mesh: jax.sharding.Mesh) -> list[LeafPlacement]:
        """A `LeafPlacement` for every array leaf of ``tree`` (NamedArrays by name, plain arrays replicated
        unless they already carry a `NamedSharding` on this mesh), in tree order."""
        mesh_sizes = mesh_axis_sizes(mesh)
        placements: list[LeafPlacement] = []

        def visit(path: Any, leaf: Any) -> None:
            placements.append(
                self._leaf(jax.tree_util.keystr(path, simple=True, separator="."), leaf, mesh, mesh_sizes)
            )

        jax.tree_util.tree_map_with_path(visit, tree, is_leaf=_is_named)
        return placements

    def _leaf(
        self, path: str, leaf: Any, mesh: jax.sharding.Mesh, mesh_sizes: Mapping[str, int]
    ) -> LeafPlacement:
        if isinstance(leaf, NamedArray):
            dims = resolve(leaf.axes, self.rules, mesh_sizes)
            shape = tuple(a.size for a in leaf.axes)
            shardable = any(d.wanted for d in dims)
            if math.prod(shape) < self.min_shard:
                why = f"{math.prod(shape)} elements < min_shard={self.min_shard}" if shardable else ""
                spec = PartitionSpec(*([None] * len(shape)))
            else:
                spec = _spec(dims)
                why = "; ".join(f"{d.axis.name}: {d.why}" for d in dims if d.why) if shardable else ""
            return LeafPlacement(path, leaf.axes, shape, leaf.dtype, spec, dims, why, shardable)
        shape = tuple(np.shape(leaf))
        dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype  # Python scalars
        existing = getattr(leaf, "sharding", None)
        if isinstance(existing, NamedSharding) and existing.mesh == mesh:
            return LeafPlacement(path, None, shape, dtype, existing.spec, why="annotated")
        return LeafPlacement(path, None, shape, dtype, PartitionSpec(), why="plain array (no axis names)")

    def shardings(self, tree: Any, mesh: jax.sharding.Mesh) -> Any:
        """A `NamedSharding` for every array leaf of ``tree``, in a tree of the same structure.

        A `NamedArray` is replaced by a NamedArray (same axes) whose leaf is its sharding, so the result
        works directly as ``out_shardings`` / ``in_shardings`` of ``jax.jit`` and with ``jax.device_put``:
        ``jax.jit(init, out_shardings=layout.shardings(jax.eval_shape(init), mesh))``.

        Args:
            tree: a pytree of NamedArrays / arrays / ``jax.ShapeDtypeStruct`` (e.g. ``jax.eval_shape``).
            mesh: the mesh to place on.

        Raises:
            ValueError: when more than ``tolerance`` of the shardable weight elements stay replicated
                (see `check`), or a rule names a mesh axis the mesh lacks.
        """
        placements = self.plan(tree, mesh)
        self._check(placements, mesh)
        shardings = iter([NamedSharding(mesh, p.spec) for p in placements])

        def swap(leaf: Any) -> Any:
            sharding = next(shardings)
            return (
                NamedArray.tree_unflatten(leaf.axes, (sharding,))
                if isinstance(leaf, NamedArray)
                else sharding
            )

        return jax.tree.map(swap, tree, is_leaf=_is_named)

    def place(self, tree: Any, mesh: jax.sharding.Mesh) -> Any:
        """``jax.device_put`` every leaf of ``tree`` into its sharding (see `shardings`; same errors).

        For a model too large for one device, create it sharded instead (`halyard.shard.init_sharded`).
        """
        return jax.device_put(tree, self.shardings(tree, mesh))

    def check(self, tree: Any, mesh: jax.sharding.Mesh) -> None:
        """Refuse a placement that leaves more than ``tolerance`` of the shardable weight elements
        replicated.

        Raises:
            ValueError: listing the share, the largest replicated weights and why each stayed whole.
        """
        self._check(self.plan(tree, mesh), mesh)

    def _check(self, placements: Sequence[LeafPlacement], mesh: jax.sharding.Mesh) -> None:
        message = tolerance_error(self.name, self.tolerance, placements, mesh)
        if message:
            raise ValueError(message)

    def describe(self, tree: Any, mesh: jax.sharding.Mesh) -> str:
        """A table of every leaf: path, axes, spec, dtype, bytes per device; then totals and the replicated
        share. Never raises for tolerance (it is the tool to understand a refusal)."""
        return describe_table(self.name, self.plan(tree, mesh), mesh)


PRESETS: tuple[str, ...] = ("data_parallel", "fsdp", "tensor_parallel", "fsdp_tensor", "expert_parallel")
"""Names accepted by `Layout.preset`."""
