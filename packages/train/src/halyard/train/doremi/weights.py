"""The domain weights' update of DoReMi's Algorithm 1, as the proxy's step applies it to one batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def excess_losses(
    proxy_loss: Float[Array, "rows pos"],
    reference_loss: Float[Array, "rows pos"],
    target: Float[Array, "rows pos"],
    domain_one_hot: Float[Array, "rows domains"],
) -> tuple[Float[Array, " domains"], Float[Array, " domains"]]:
    """Each domain's excess loss in a batch and its target tokens.

    Args:
        proxy_loss: the proxy model's loss of every position (nats).
        reference_loss: the reference model's loss of the same positions.
        target: 1 where a position is a training target, else 0.
        domain_one_hot: 1 in the column of each row's domain.

    Returns:
        ``(excess, tokens)``: per domain, the proxy's loss minus the reference's clipped at 0, averaged over
        that domain's target tokens (0 for a domain the batch lacks), and the number of those tokens.
    """
    clipped = jnp.maximum(proxy_loss - reference_loss, 0.0) * target
    tokens = target.sum(axis=1) @ domain_one_hot
    summed = clipped.sum(axis=1) @ domain_one_hot
    return summed / jnp.maximum(tokens, 1.0), tokens


def updated_weights(
    weights: Float[Array, " domains"],
    excess: Float[Array, " domains"],
    *,
    step_size: float,
    smoothing: float,
) -> Float[Array, " domains"]:
    """The next domain weights: an exponentiated-gradient step on the excess losses, mixed with the uniform
    distribution.

    ``weights' = softmax(log weights + step_size * excess)``, then ``(1 - smoothing) * weights' + smoothing / k``
    for ``k`` domains.

    Args:
        weights: the current weights (positive, summing to 1).
        excess: each domain's excess loss in this batch (`excess_losses`).
        step_size: the exponentiated gradient's step (the paper's 1).
        smoothing: the uniform distribution's share (the paper's 1e-3).
    """
    moved = jax.nn.softmax(jnp.log(weights) + step_size * excess)
    return (1.0 - smoothing) * moved + smoothing / weights.shape[0]


def weighted_domain_loss(
    domain_loss_sums: Float[Array, " domains"],
    tokens: Float[Array, " domains"],
    weights: Float[Array, " domains"],
) -> Float[Array, ""]:
    """The proxy's objective: the sum over domains of each domain's weight times its mean loss in the batch
    (a domain the batch lacks adds 0).

    Args:
        domain_loss_sums: the proxy's loss summed over each domain's target tokens.
        tokens: each domain's target tokens.
        weights: the domain weights of this step (no gradient flows into them).
    """
    means = domain_loss_sums / jnp.maximum(tokens, 1.0)
    return jnp.sum(jax.lax.stop_gradient(weights) * means)
