"""The invariant step's slices for a run (`trainer.invariant`), or a one-line refusal naming the key."""

from __future__ import annotations

import jax

from halyard.shard import DCN_AXES, Layout, mesh_axis_sizes
from halyard.train.config.schema import choice_name_of
from halyard.train.invariant.slices import CanonicalSlices
from halyard.train.optim.config import OptimizerConfig
from halyard.train.run_config import TrainConfig
from halyard.train.user_errors import ConfigError

INVARIANT_OPTIMIZERS = ("adamw", "lion")
"""Optimizers whose update is elementwise, so the same on any sharding once the gradient and its norm are.
Sophia-H's Hessian estimate and Muon's Newton-Schulz iterations contract over sharded weights."""


def canonical_slices(
    config: TrainConfig, mesh: jax.sharding.Mesh, layout: Layout | None = None
) -> CanonicalSlices | None:
    """How the run's invariant step cuts each microbatch, or None when ``trainer.invariant`` is off.

    Args:
        config: the run config.
        mesh: the run's mesh.
        layout: the run's layout (where the weights are, so that they stay there), None for whole weights.

    Raises:
        ConfigError: an optimizer the invariant step does not cover, a mesh axis other than replica, data,
            fsdp larger than 1, or batch devices that do not divide the slices.
    """
    trainer = config.trainer
    if not trainer.invariant:
        return None
    kind = choice_name_of(OptimizerConfig, config.optimizer)
    if kind not in INVARIANT_OPTIMIZERS:
        raise ConfigError(
            f"trainer.invariant=true covers optimizer.type {' and '.join(INVARIANT_OPTIMIZERS)}, not {kind} "
            "(its statistics contract over sharded weights); use one of those or set trainer.invariant=false"
        )
    sizes = mesh_axis_sizes(mesh)
    split = {name: size for name, size in sizes.items() if size > 1 and name not in DCN_AXES}
    if split:
        named = ", ".join(f"trainer.mesh.{name}={size}" for name, size in split.items())
        raise ConfigError(
            f"trainer.invariant=true covers the replica, data and fsdp axes only, not {named} (they split "
            "contractions); set those to 1 or trainer.invariant=false"
        )
    slices = CanonicalSlices(mesh, trainer.canonical_slices, config.optimizer.max_grad_norm, layout)
    if slices.slices % slices.batch_devices:
        raise ConfigError(
            f"trainer.invariant_slices: {slices.slices} slices a microbatch do not spread over "
            f"{slices.batch_devices} batch devices (replica x data x fsdp); set trainer.invariant_slices to a "
            f"multiple of {slices.batch_devices} that divides trainer.batch_size / trainer.accumulation"
        )
    return slices
