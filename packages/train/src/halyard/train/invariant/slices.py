"""A batch cut into canonical slices, each slice's sums computed alike on whichever device runs it, and the
slices' sums added in one pairwise tree over the slice index."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import PartitionSpec

from halyard.shard import BATCH_AXES, Layout, mesh_axis_sizes, without_layout
from halyard.train.invariant.trees import scan_tree_sum, sum_over_devices, tree_sum
from halyard.train.invariant.view import gathered_view, sharded_weights, weight_specs

SliceTerm = Callable[..., Any]
"""``(params, batch, key, frozen) -> pytree of sums``."""


@dataclass(frozen=True)
class CanonicalSlices:
    """How the invariant step cuts a (micro)batch and where it runs.

    Args:
        mesh: the run's mesh; only its batch axes (replica, data, fsdp, expert) may be larger than 1.
        slices: canonical slices per (micro)batch, a power of two that the batch devices divide.
        max_grad_norm: clip the gradients to this canonical global norm (None: no clipping).
        layout: where the weights live (the run's ``trainer.layout``): weights it splits stay split, each
            layer stack gathered one layer at a time as a slice runs it, and gradients and norms are reduced
            onto the shards. None: every weight gathered whole on every device.
    """

    mesh: jax.sharding.Mesh
    slices: int
    max_grad_norm: float | None = None
    layout: Layout | None = None

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The mesh axes the slices are spread over, in mesh order."""
        return tuple(name for name in self.mesh.axis_names if name in BATCH_AXES)

    @property
    def batch_devices(self) -> int:
        """Devices the slices are spread over (the product of the batch axes' sizes)."""
        sizes = mesh_axis_sizes(self.mesh)
        return math.prod(sizes[name] for name in self.batch_axes)


def sliced_sums(term: SliceTerm, split: CanonicalSlices) -> SliceTerm:
    """``term`` summed over a batch's canonical slices, in the canonical order, the sums on every device.

    Args:
        term: ``(params, slice rows, key, frozen) -> pytree of sums`` of one slice (a loss sum and its
            token count).
        split: the slice count, the mesh and the layout. Slice ``i`` (rows ``i * R`` to ``(i + 1) * R`` of a
            batch of ``slices * R`` rows) gets the key ``fold_in(key, i)``.

    Returns:
        The same signature for a whole batch ``[slices * R, ...]`` whose rows are split over the batch axes.
    """

    def sums(params: Any, batch: dict[str, jax.Array], key: jax.Array, frozen: Any = None) -> Any:
        sliced = _Sliced(split, params)

        def slice_sums(shards: Any, rows: Any, slice_key: jax.Array, frozen: Any) -> Any:
            return term(sliced.view(shards), rows, slice_key, frozen), None

        return sliced.run(slice_sums, params, batch, key, frozen, differentiated=False)[0]

    return sums


def sliced_value_and_grad(loss: SliceTerm, split: CanonicalSlices) -> SliceTerm:
    """``jax.value_and_grad(loss, has_aux=True)`` of a batch summed over its canonical slices: ``((loss sum,
    stat sums), gradient sums)``, each added in the canonical order; the sums on every device, the gradients
    in the layout's shards.

    Args:
        loss: ``(params, slice rows, key, frozen) -> (loss sum, pytree of sums)`` of one slice.
        split: as for `sliced_sums`.
    """

    def value_and_grad(params: Any, batch: dict[str, jax.Array], key: jax.Array, frozen: Any = None) -> Any:
        sliced = _Sliced(split, params)

        def slice_value_and_grad(shards: Any, rows: Any, slice_key: jax.Array, frozen: Any) -> Any:
            def slice_loss(shards: Any) -> Any:
                return loss(sliced.view(shards), rows, slice_key, frozen)

            return jax.value_and_grad(slice_loss, has_aux=True)(shards)

        return sliced.run(slice_value_and_grad, params, batch, key, frozen, differentiated=True)

    return value_and_grad


class _Sliced:
    """One batch's slices on the mesh.

    With weights the layout splits, device ``d`` of ``D`` runs slice ``t * D + d`` at its step ``t``: the
    ``D`` slices of a step are adjacent, so the tree's lowest levels add them across the devices, and each
    weight's gradient is reduced onto its shards as the backward pass produces it (`ShardedWeight`); the
    devices' steps then add the step sums in the tree's upper levels. With whole weights device ``d`` runs the
    contiguous slices ``d * L`` to ``(d + 1) * L - 1`` instead, adds them in the tree's lower levels, and the
    devices' sums are added once at the end (`sum_over_devices`): one exchange of the gradient rather than
    one a step.
    """

    def __init__(self, split: CanonicalSlices, params: Any) -> None:
        self.split = split
        self.axes = split.batch_axes
        self.devices = split.batch_devices
        self.steps = split.slices // self.devices
        self.weights = sharded_weights(params, split.mesh, split.layout)
        self.specs = PartitionSpec() if self.weights is None else weight_specs(self.weights)

    def view(self, shards: Any) -> Any:
        """What a slice's term gets: the model from this device's shards, or the whole weights themselves."""
        return shards if self.weights is None else gathered_view(shards, self.weights)

    def run(
        self,
        term: Callable[..., tuple[Any, Any]],
        params: Any,
        batch: dict[str, jax.Array],
        key: jax.Array,
        frozen: Any,
        differentiated: bool,
    ) -> tuple[Any, Any]:
        """``term(shards, rows, key, frozen) -> (sums, gradients)`` of each slice, added in the canonical
        order: the sums on every device, the gradients in the weights' shards (``differentiated``; else the
        term returns None for them)."""
        interleaved = self.weights is not None
        if interleaved:  # rows of slice t * D + d to device d's step t
            batch = jax.tree.map(self._interleave, batch)

        def per_device(shards: Any, rows: dict[str, jax.Array], key: jax.Array, frozen: Any) -> Any:
            device = jax.lax.axis_index(self.axes) if self.axes else 0
            rows = jax.tree.map(lambda x: x.reshape((self.steps, -1) + x.shape[1:]), rows)

            def one_step(step: jax.Array, slice_rows: dict[str, jax.Array]) -> Any:
                index = step * self.devices + device if interleaved else device * self.steps + step
                # Barriers keep the slice's program whole: with one slice a device XLA drops the loop and
                # would fuse its last reductions with what follows (the loss of a step parted in the last bit).
                inputs = jax.lax.optimization_barrier((shards, slice_rows, jax.random.fold_in(key, index)))
                sums, gradients = term(*inputs, frozen)
                if interleaved:  # the step's D slices, adjacent in the tree
                    sums = jax.tree.map(self._sum_over_step, sums)
                return jax.lax.optimization_barrier((sums, gradients))

            # The model's activation constraints name mesh axes; here each array is already one device's.
            with without_layout():
                sums, gradients = scan_tree_sum(one_step, self.steps, rows)
            if not interleaved:
                sums, gradients = jax.tree.map(self._sum_over_devices, (sums, gradients))
            return sums, gradients

        sharded = jax.shard_map(
            per_device,
            mesh=self.split.mesh,
            in_specs=(self.specs, PartitionSpec(self.axes), PartitionSpec(), PartitionSpec()),
            out_specs=(PartitionSpec(), self.specs if differentiated else PartitionSpec()),
            check_vma=False,
        )
        return sharded(params, batch, key, frozen)

    def _interleave(self, x: jax.Array) -> jax.Array:
        """``[S * R, ...]`` rows to the order in which device ``d``'s block holds slices ``d, D + d, ...``."""
        by_slice = x.reshape((self.steps, self.devices, -1) + x.shape[1:])
        return by_slice.swapaxes(0, 1).reshape(x.shape)

    def _sum_over_step(self, x: jax.Array) -> jax.Array:
        return tree_sum(jax.lax.all_gather(x, self.axes)) if self.devices > 1 else x

    def _sum_over_devices(self, x: jax.Array) -> jax.Array:
        return sum_over_devices(x, self.axes, self.devices)
