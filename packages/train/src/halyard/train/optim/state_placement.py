"""Where and in what dtype the optimizer keeps its state: two wrappers around any optax transformation.

- `with_state_dtype`: the optimizer sees float parameters and gradients cast to ``dtype`` (so its moments
  are created and updated in it) and hands back updates in the parameters' own dtype. With
  ``model.param_dtype: bfloat16`` and ``model.optimizer_dtype: float32`` the weights take half the memory
  while Adam's moments stay float32 (the precision policy's third dtype, beside the parameters' and the
  compute's).
- `with_host_state`: the state lives in the host's pinned memory between steps (``memory_kind=
  "pinned_host"``; `trainer.offload_optimizer_state`); each update brings it to the device, updates, and
  sends it back, so between steps the device holds only parameters, gradients and activations.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax


def _cast_floats(tree: Any, dtype: Any) -> Any:
    """``tree`` with its floating leaves cast to ``dtype`` (integers, keys and None untouched)."""

    def cast(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.astype(dtype)
        return leaf

    return jax.tree_util.tree_map(cast, tree)


def with_state_dtype(
    optimizer: optax.GradientTransformationExtraArgs, dtype: Any
) -> optax.GradientTransformationExtraArgs:
    """``optimizer`` run in ``dtype``: its state (moments) in ``dtype``, its updates in each parameter's dtype.

    Args:
        optimizer: any optax transformation (extra arguments such as Sophia-H's ``loss_fn`` pass through).
        dtype: the dtype of the optimizer's state and arithmetic, e.g. ``jnp.float32``.
    """
    dtype = jnp.dtype(dtype)

    def init(params: Any) -> Any:
        return optimizer.init(_cast_floats(params, dtype))

    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> tuple[Any, Any]:
        wide_params = None if params is None else _cast_floats(params, dtype)
        new_updates, state = optimizer.update(_cast_floats(updates, dtype), state, wide_params, **extra)
        narrowed = jax.tree_util.tree_map(lambda new, old: new.astype(old.dtype), new_updates, updates)
        return narrowed, state

    return optax.GradientTransformationExtraArgs(init, update)


def with_host_state(
    optimizer: optax.GradientTransformationExtraArgs,
) -> optax.GradientTransformationExtraArgs:
    """``optimizer`` whose state is read from and written back to pinned host memory in each update.

    The state's placement between steps comes from its shardings (`host_shardings`); inside the jitted step
    this moves it to the device for the update and back to the host after it.
    """

    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> tuple[Any, Any]:
        on_device = jax.device_put(state, jax.memory.Space.Device)
        new_updates, new_state = optimizer.update(updates, on_device, params, **extra)
        return new_updates, jax.device_put(new_state, jax.memory.Space.Host)

    return optax.GradientTransformationExtraArgs(optimizer.init, update)


def host_shardings(shardings: Any) -> Any:
    """Each `jax.sharding.NamedSharding` of ``shardings`` with ``memory_kind="pinned_host"``."""
    return jax.tree_util.tree_map(
        lambda sharding: sharding.with_memory_kind("pinned_host"),
        shardings,
        is_leaf=lambda leaf: isinstance(leaf, jax.sharding.Sharding),
    )
