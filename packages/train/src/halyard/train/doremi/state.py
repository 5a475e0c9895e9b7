"""Where the domain weights live: beside the optimizer's state, so that every checkpoint holds them and a
resumed proxy run goes on with the same weights (and the same running sum of them)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax


class DomainWeightsState(NamedTuple):
    """The proxy run's optimizer state.

    Attributes:
        inner: the model optimizer's own state.
        weights: the domain weights of the last step ``[domains]`` (the initial ones before step 1).
        weight_sum: the sum of the weights of every step so far ``[domains]``; divided by the step count it is
            DoReMi's answer, the average weights.
    """

    inner: Any
    weights: Any
    weight_sum: Any


def with_domain_weights(
    optimizer: optax.GradientTransformation, initial: list[float]
) -> optax.GradientTransformationExtraArgs:
    """``optimizer`` whose state also holds the domain weights (`DomainWeightsState`), starting at ``initial``.

    Its update leaves the weights as they are: the proxy's step (`halyard.train.doremi.step`) sets them.

    Args:
        optimizer: the model's optimizer.
        initial: the starting weights, one per domain in the mixture's source order, summing to 1.
    """
    inner = optax.with_extra_args_support(optimizer)

    def init(params: Any) -> DomainWeightsState:
        weights = jnp.asarray(initial, jnp.float32)
        return DomainWeightsState(inner.init(params), weights, jnp.zeros_like(weights))

    def update(
        updates: Any, state: DomainWeightsState, params: Any = None, **extra: Any
    ) -> tuple[Any, DomainWeightsState]:
        updates, inner_state = inner.update(updates, state.inner, params, **extra)
        return updates, state._replace(inner=inner_state)

    return optax.GradientTransformationExtraArgs(init, update)
