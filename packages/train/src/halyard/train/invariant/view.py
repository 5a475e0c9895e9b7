"""The model a canonical slice runs with inside the invariant step, built from one device's FSDP shards: each
layer stack's weights gathered layer by layer inside its scan, every other weight gathered whole."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from halyard.models import CausalLM
from halyard.named.nn import Stacked
from halyard.shard import BATCH_AXES, Layout, mesh_axis_sizes
from halyard.train.invariant.gathers import GATHERED, ShardedWeight


class GatheredStacked(Stacked[Any]):
    """A `Stacked` whose arrays are this device's FSDP shards: each layer's weights are gathered whole inside
    the scan (`ShardedWeight.gather`), so a slice's forward and backward hold one layer's gathered weights at
    a time, and each layer's gradient is reduced to the shards as the backward pass produces it. The
    backward pass gathers a layer's weights again instead of keeping them, whatever the stack's ``remat``.

    Attributes:
        layer_weights: one `ShardedWeight` per array of a layer (the stacked arrays without their ``Layers``
            dimension), in leaf order.
    """

    layer_weights: tuple[ShardedWeight, ...] = eqx.field(static=True, default=())
    recomputed_names: ClassVar[tuple[str, ...]] = (GATHERED,)

    def layer_parameters(self, params: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(params)
        gathered = [
            checkpoint_name(weight.gather(shard), GATHERED)
            for weight, shard in zip(self.layer_weights, leaves, strict=True)
        ]
        return jax.tree_util.tree_unflatten(treedef, gathered)


def _is_stack(node: Any) -> bool:
    return isinstance(node, Stacked)


def sharded_weights(params: Any, mesh: jax.sharding.Mesh, layout: Layout | None) -> Any:
    """A `ShardedWeight` for every array of ``params`` (a tree of the same structure), or None when every
    weight is whole on every device (no layout, or one that splits nothing on this mesh).

    Args:
        params: what the step trains (shapes suffice); a `CausalLM` whose compute dtype differs from its
            parameters' has its weights cast as they are gathered (`gathered_view` stops the model's own cast).
        mesh: the run's mesh; only its batch axes may be larger than 1.
        layout: where the weights are (``layout.plan``), None for whole weights.

    Raises:
        ValueError: a weight split over a mesh axis that is not a batch axis.
    """
    if layout is None:
        return None
    sizes = mesh_axis_sizes(mesh)
    batch_axes = tuple((name, sizes[name]) for name in mesh.axis_names if name in BATCH_AXES)
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), x.dtype), params)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    placements = layout.plan(shapes, mesh)
    compute = _cast_dtype(params)
    weights = []
    for leaf, placement in zip(leaves, placements, strict=True):
        dims = tuple(_split_axes(entry, sizes) for entry in _padded(placement.spec, leaf.ndim))
        other = [axis for axes in dims for axis in axes if axis not in BATCH_AXES]
        if other:
            raise ValueError(
                f"{placement.path} is split over mesh axis {other[0]!r}: the invariant step splits batch axes only"
            )
        floating = jnp.issubdtype(leaf.dtype, jnp.floating)
        weights.append(
            ShardedWeight(dims, batch_axes, jnp.dtype(leaf.dtype).name, compute if floating else None)
        )
    if not any(axes for weight in weights for axes in weight.dims):
        return None
    return jax.tree_util.tree_unflatten(treedef, weights)


def weight_specs(weights: Any) -> Any:
    """The ``PartitionSpec`` of each weight (a tree like ``weights``) for ``shard_map``."""
    return jax.tree.map(
        lambda w: PartitionSpec(*(axes or None for axes in w.dims)),
        weights,
        is_leaf=lambda x: isinstance(x, ShardedWeight),
    )


def gathered_view(shards: Any, weights: Any) -> Any:
    """Inside ``shard_map``: the model one device's ``shards`` stand for, its layer stacks gathered layer by
    layer (`GatheredStacked`), every other weight gathered whole; differentiate through it for the gradient
    of the shards, reduced over the batch devices (`ShardedWeight.gather`).

    Args:
        shards: this device's shards of the trained tree.
        weights: `sharded_weights` of that tree.
    """

    def visit(node: Any, weight: Any) -> Any:
        if _is_stack(node):
            return _gathered_stack(node, weight)
        return weight.gather(node)

    view = jax.tree.map(visit, shards, weights, is_leaf=_is_stack)
    if isinstance(view, CausalLM) and _cast_dtype(view) is not None:
        # The weights arrive cast (`ShardedWeight.compute_dtype`): the model must not cast them again, nor
        # its layer stacks' shards, whose gradients are then reduced in the parameter dtype.
        view = dataclasses.replace(view, config=view.model_config.replace(compute_dtype=None))  # type: ignore[call-arg]
    return view


def _gathered_stack(stack: Stacked[Any], weights: Stacked[Any]) -> GatheredStacked:
    per_layer = []
    for weight in jax.tree_util.tree_leaves(weights, is_leaf=lambda x: isinstance(x, ShardedWeight)):
        if weight.dims[0]:
            raise ValueError(
                f"a layer stack's {stack.Layers.name!r} axis is split over {weight.dims[0]}: the invariant "
                "step gathers a layer stack one layer at a time, so that axis must stay whole"
            )
        per_layer.append(dataclasses.replace(weight, dims=weight.dims[1:]))
    return GatheredStacked(stack.stacked, stack.Layers, stack.remat, layer_weights=tuple(per_layer))


def _cast_dtype(params: Any) -> str | None:
    """The dtype a model's weights are cast to for its computation, when it differs from theirs; else None."""
    if not isinstance(params, CausalLM):
        return None
    config = params.model_config
    if config.compute_dtype is None or jnp.dtype(config.compute_dtype) == jnp.dtype(config.param_dtype):
        return None
    return jnp.dtype(config.compute_dtype).name


def _padded(spec: PartitionSpec, ndim: int) -> tuple[Any, ...]:
    return tuple(spec) + (None,) * (ndim - len(spec))


def _split_axes(entry: Any, sizes: dict[str, int]) -> tuple[str, ...]:
    """A ``PartitionSpec`` entry's mesh axes of size > 1."""
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return tuple(axis for axis in axes if sizes[axis] > 1)
