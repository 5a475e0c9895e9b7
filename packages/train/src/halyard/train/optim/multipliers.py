"""Per-parameter learning-rate multipliers (muP and friends) as one optax transformation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import optax

from halyard.train.optim.paths import map_parameters

MultiplierFn = Callable[[str, Any], float]
"""`fn(path_name, parameter) -> multiplier`, e.g. `lambda name, p: 1 / width_ratio if "mlp" in name else 1.0`."""


class MultipliersState(NamedTuple):
    """No state: multipliers are fixed when the optimizer is built."""


def resolve_multipliers(multipliers: Any | MultiplierFn, params: Any) -> Any:
    """A tree of floats with the leaf structure of `params`, from a tree or from a function of the path.

    Args:
        multipliers: either a pytree with the structure of `params` holding a float per parameter, or
            a `MultiplierFn` called once per parameter with its dotted path name.
        params: the parameters (or updates) the multipliers apply to.
    """
    # A model-shaped tree (an equinox module is callable too) is a tree, not a function.
    if callable(multipliers) and jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(multipliers)):
        return map_parameters(lambda name, parameter: float(multipliers(name, parameter)), params)
    return multipliers


def scale_by_multipliers(multipliers: Any | MultiplierFn) -> optax.GradientTransformation:
    """Multiply each parameter's update by its own constant (chain it after the learning rate).

    muP gives hidden matrices a learning rate scaled by `base_width / width`; this applies any such
    per-parameter factor. Parameters absent from a multiplier tree are an error (the structures must match).

    Args:
        multipliers: a pytree of floats with the structure of the parameters, or a `MultiplierFn`.

    Raises:
        ValueError: (from jax) when a multiplier tree does not match the parameters' structure.
    """

    def init(params: Any) -> MultipliersState:
        del params
        return MultipliersState()

    def update(updates: Any, state: MultipliersState, params: Any = None) -> tuple[Any, MultipliersState]:
        del params
        factors = resolve_multipliers(multipliers, updates)
        return jax.tree.map(lambda factor, update: update * factor, factors, updates), state

    return optax.GradientTransformation(init, update)
