"""A circular pipeline of the decoder's layer stack over the ``stage`` mesh axis.

The ``L`` stacked layers are cut into ``S`` stages x ``R`` repeats of ``L / (S R)`` consecutive layers:
stage ``s`` holds the layers of blocks ``s, s + S, s + 2S, ...`` (block ``b`` = layers ``b L/(SR)`` to
``(b + 1) L/(SR) - 1``), so a microbatch passes every stage ``R`` times in layer order. The batch is cut
into ``M >= S`` microbatches. Each of the ``R M + S - 1`` iterations runs every stage once, on its own
device group (a ``vmap`` over the stage dimension, sharded over ``stage``), then passes each stage's
output to the next stage (a roll of that dimension: a collective permute). Stage 0 takes a new
microbatch while there is one, else the last stage's output of ``S - 1`` iterations ago. A stage idles
(computes on data it throws away) during ``S - 1`` of the iterations: the bubble is
``(S - 1) / (R M + S - 1)``.

The weights keep their ``[layers, ...]`` tree, so checkpoints are the same with or without a pipeline;
with ``R > 1`` the step re-cuts them into ``[R, S, layers/(SR), ...]`` (moving every stage's weights to
its devices). Weights sharded over ``fsdp`` inside a stage are gathered for every iteration, i.e. once
per microbatch and repeat. Activation memory is GPipe's with remat: with any remat policy but ``none``
an iteration keeps only its stages' inputs and the backward pass recomputes each stage (the policy
applying inside it), so a device holds ``R M + S - 1`` stage inputs of one microbatch; a schedule
whose memory does not grow with ``M`` (1F1B) interleaves backward and forward passes of different
microbatches, which one differentiated scan cannot express.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from halyard.named import Axis, NamedArray
from halyard.named.nn import Stacked
from halyard.named.nn.layer_stack import add_layers_axis, layer_view
from halyard.shard import ActiveLayout, active_layout

STAGE = "stage"
BATCH = "batch"


@dataclass(frozen=True)
class PipelineSchedule:
    """``stages`` x ``repeats`` pieces of the layer stack, ``microbatches`` per batch."""

    stages: int
    repeats: int
    microbatches: int

    @property
    def iterations(self) -> int:
        return self.repeats * self.microbatches + self.stages - 1

    @property
    def bubble(self) -> float:
        """The share of iterations a stage computes nothing it keeps."""
        return (self.stages - 1) / self.iterations

    def problem(self, layers: int, batch: int, period: int = 1) -> str | None:
        """Why this schedule cannot run ``layers`` layers (a pattern of ``period``) on ``batch`` rows."""
        pieces = self.stages * self.repeats
        if layers % pieces or (layers // pieces) % period:
            return (
                f"{layers} layers do not cut into {self.stages} stages x {self.repeats} repeats of equal length"
                + (f" holding whole periods of the {period}-layer pattern" if period > 1 else "")
            )
        if self.microbatches < self.stages:
            return f"{self.microbatches} microbatches are fewer than the {self.stages} stages"
        if batch % self.microbatches:
            return f"a batch of {batch} rows does not cut into {self.microbatches} microbatches"
        return None


def pipeline_stages(layout: ActiveLayout | None = None) -> int:
    """The size of the active mesh's ``stage`` axis (1 without a layout)."""
    active = layout if layout is not None else active_layout()
    return 1 if active is None else dict(active.mesh.shape).get(STAGE, 1)


def run_pipelined(
    layers: Stacked[Any],
    x: NamedArray,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    schedule: PipelineSchedule,
    kinds: Sequence[Hashable] | None,
    unroll: bool,
) -> tuple[NamedArray, Any]:
    """``layers.scan(x, *args, kinds=kinds, **kwargs)`` computed as a pipeline over ``stage``: the output,
    and what the layers report (their outputs' second part, e.g. MoE router sums) for every iteration,
    stage and layer of a stage ``[iterations, S, layers/(SR), ...]``, zero where a stage idles; sums over
    tokens (MoE statistics) then sum to the whole batch's.

    Args:
        layers: the stacked layers; each returns ``(x, (cache, report))``.
        x: the activations ``(batch, ..., embed)``.
        args, kwargs: the layers' other inputs; NamedArrays with a ``batch`` axis are cut into the same
            microbatches as ``x``, everything else is passed to every stage as it is.
        schedule: stages (the mesh's ``stage`` size), repeats and microbatches.
        kinds: the per-layer kinds of the stack (one pattern must repeat within each stage's layers).
        unroll: unroll each stage's layer loop.

    Raises:
        ValueError: see `PipelineSchedule.problem`; no active layout with that ``stage`` size.
    """
    active = active_layout()
    if active is None or pipeline_stages(active) != schedule.stages:
        raise ValueError(
            f"pipeline: {schedule.stages} stages need an active layout with a stage axis of that size"
        )
    S, R, M = schedule.stages, schedule.repeats, schedule.microbatches
    total = layers.Layers.size
    per_stage = total // (S * R)
    batch_index = x.axis_names.index(BATCH)
    period = layer_pattern_period(kinds)
    if (reason := schedule.problem(total, x.array.shape[batch_index], period)) is not None:
        raise ValueError(f"pipeline: {reason}")
    mesh, layout = active.mesh, active.layout
    micro = _Microbatches(M)
    x_axes = micro.axes(x)
    sizes = dict(mesh.shape)
    shards = math.prod(sizes[a] for a in layout.mesh_axes_for(BATCH, mesh))
    rows = x.array.shape[batch_index] // M
    if rows % shards:
        # XLA pads uneven shards; the gradients it computed through this loop were then wrong (jaxlib 0.10)
        raise ValueError(
            f"pipeline: a microbatch of {rows} rows does not split over the {shards} devices of the batch axes; "
            f"use a batch of a multiple of {M * shards} rows"
        )
    spec = PartitionSpec(STAGE, *layout.partition_spec(x_axes, mesh))
    first = micro.split(x)  # [M, mb, ...]
    inputs = jax.tree.map(micro.split_if_batched, (args, kwargs), is_leaf=_is_named)
    dynamic, static = eqx.partition(layer_view(layers.stacked, layers.Layers), eqx.is_array)
    weights = jax.tree.map(lambda a: a.reshape(R, S, per_stage, *a.shape[1:]), dynamic)
    stage_kinds = None if kinds is None else list(kinds[:per_stage])
    sub_axis = Axis(layers.Layers.name, per_stage)

    def stage(
        all_repeats: Any, repeat: jax.Array, activation: jax.Array, stage_inputs: Any
    ) -> tuple[jax.Array, Any]:
        # the repeat is picked here, under the checkpoint: an iteration keeps its index, not the weights
        stage_weights = jax.tree.map(lambda w: _take_repeat(w, repeat), all_repeats)
        stacked = add_layers_axis(eqx.combine(stage_weights, static), sub_axis)
        sub = Stacked(stacked, sub_axis, layers.remat)
        stage_args, stage_kwargs = jax.tree.map(micro.rebuild, stage_inputs, is_leaf=_is_named)
        out, (_, reports) = sub.scan(
            NamedArray(activation, x_axes), *stage_args, kinds=stage_kinds, unroll=unroll, **stage_kwargs
        )
        return out.array, reports

    if layers.remat != "none":  # keep each iteration's stage inputs only; the backward recomputes the stage
        stage = jax.checkpoint(stage, prevent_cse=False)
    mapped = jax.tree.map(lambda leaf: 0 if isinstance(leaf, _Split) else None, inputs, is_leaf=_is_named)
    stages = jax.vmap(stage, in_axes=(1, 0, 0, mapped), spmd_axis_name=STAGE)
    stage_index = jnp.arange(S)

    def iteration(
        carry: tuple[jax.Array, jax.Array], t: jax.Array
    ) -> tuple[tuple[jax.Array, jax.Array], Any]:
        state, finished = carry
        passed = jnp.roll(state, 1, axis=0)  # stage s takes stage s-1's output: a collective permute
        entering = jnp.where(t < M, first[t % M], finished[t % M])
        state_in = _constrained(passed.at[0].set(entering), mesh, spec)
        work = t - stage_index  # this iteration's (repeat * M + microbatch) of each stage
        repeat = jnp.clip(work // M, 0, R - 1)
        stage_inputs = jax.tree.map(lambda a: _take_microbatch(a, work % M), inputs, is_leaf=_is_named)
        out, reports = stages(weights, repeat, state_in, stage_inputs)
        out = _constrained(out, mesh, spec)
        last = work[S - 1]
        keep = (last >= 0) & (last < R * M)
        finished = jnp.where(keep, finished.at[last % M].set(out[S - 1]), finished)
        working = (work >= 0) & (work < R * M)  # a stage in the bubble reports nothing
        reports = jax.tree.map(lambda r: r * working.reshape(S, *[1] * (r.ndim - 1)).astype(r.dtype), reports)
        return (out, finished), reports

    state = jnp.zeros((S, *first.shape[1:]), first.dtype)
    (_, finished), reports = jax.lax.scan(
        iteration, (state, jnp.zeros_like(first)), jnp.arange(schedule.iterations)
    )
    return micro.join(finished, x), reports


@dataclass(frozen=True)
class _Microbatches:
    """Cuts arrays with a ``batch`` axis into ``count`` microbatches (a new leading dimension) and back."""

    count: int

    def axes(self, x: NamedArray) -> tuple[Axis, ...]:
        return tuple(a.resize(a.size // self.count) if a.name == BATCH else a for a in x.axes)

    def split(self, x: NamedArray) -> jax.Array:
        index = x.axis_names.index(BATCH)
        array = jnp.moveaxis(x.array, index, 0)
        array = array.reshape(self.count, array.shape[0] // self.count, *array.shape[1:])
        return jnp.moveaxis(array, 1, index + 1)

    def split_if_batched(self, leaf: Any) -> Any:
        if isinstance(leaf, NamedArray) and BATCH in leaf.axis_names:
            return _Split(self.split(leaf), self.axes(leaf))
        return leaf

    @staticmethod
    def rebuild(leaf: Any) -> Any:
        return NamedArray(leaf.array, leaf.axes) if isinstance(leaf, _Split) else leaf

    def join(self, parts: jax.Array, like: NamedArray) -> NamedArray:
        index = like.axis_names.index(BATCH)
        array = jnp.moveaxis(parts, index + 1, 1)
        array = array.reshape(array.shape[0] * array.shape[1], *array.shape[2:])
        return NamedArray(jnp.moveaxis(array, 0, index), like.axes)


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class _Split:
    """A microbatched array ``[M, ...]`` and the axes of one microbatch."""

    array: jax.Array
    axes: tuple[Axis, ...]

    def tree_flatten(self) -> tuple[tuple[jax.Array], tuple[Axis, ...]]:
        return (self.array,), self.axes

    @classmethod
    def tree_unflatten(cls, axes: tuple[Axis, ...], children: tuple[jax.Array]) -> _Split:
        return cls(children[0], axes)


def _is_named(leaf: Any) -> bool:
    return isinstance(leaf, NamedArray | _Split)


def layer_pattern_period(kinds: Sequence[Hashable] | None) -> int:
    """The shortest period after which ``kinds`` (each layer's kind) repeats; 1 without kinds."""
    if kinds is None:
        return 1
    for period in range(1, len(kinds) + 1):
        if len(kinds) % period == 0 and all(kinds[i] == kinds[i % period] for i in range(len(kinds))):
            return period
    return len(kinds)


def _constrained(array: jax.Array, mesh: Any, spec: PartitionSpec) -> jax.Array:
    return jax.lax.with_sharding_constraint(array, NamedSharding(mesh, spec))


def _take_repeat(weights: jax.Array, repeat: jax.Array) -> jax.Array:
    """One stage's weights ``[R, ...]`` at ``repeat``."""
    if weights.shape[0] == 1:
        return weights[0]
    return jax.lax.dynamic_index_in_dim(weights, repeat, keepdims=False)


def _take_microbatch(leaf: Any, microbatch: jax.Array) -> Any:
    if isinstance(leaf, _Split):
        return _Split(jnp.take(leaf.array, microbatch, axis=0), leaf.axes)
    return leaf
