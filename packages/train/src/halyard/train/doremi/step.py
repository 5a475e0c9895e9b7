"""The proxy's train step: the reference model's forward, the domain weights' step and the proxy's update,
one compiled program."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from halyard.train.doremi.loss import per_position_loss
from halyard.train.doremi.state import DomainWeightsState
from halyard.train.step import TrainState

REFERENCE_MODEL = "reference_model"
"""The batch key under which `halyard.train.doremi.reference.reference_model_hook` hands the step the
reference model's parameters (sharded like the proxy's, never differentiated)."""


def make_doremi_step(
    train_step: Callable[..., tuple[TrainState, dict[str, Any]]], z_loss_weight: float = 0.0
) -> Callable[..., tuple[TrainState, dict[str, Any]]]:
    """Wrap the ordinary ``train_step`` (built on `halyard.train.doremi.loss.doremi_loss_fn` and an optimizer of
    `halyard.train.doremi.state.with_domain_weights`) into the proxy's step.

    Before the update it computes the reference model's loss of every position of the batch (no gradient)
    and hands it, with the previous step's domain weights, to the loss; after it, the state keeps the
    weights the loss chose (``metrics["domain_weights"]``) and adds them to the running sum. A step whose
    update was skipped (non-finite) keeps the previous weights.

    Args:
        train_step: ``(state, batch, frozen) -> (state, metrics)`` of `halyard.train.step.make_train_step`.
        z_loss_weight: the run's z-loss weight, also in the reference's per-position loss.
    """

    def step(
        state: TrainState, batch: dict[str, Any], frozen: Any = None
    ) -> tuple[TrainState, dict[str, Any]]:
        batch = dict(batch)
        reference = batch.pop(REFERENCE_MODEL)
        opt_state: DomainWeightsState = state.opt_state
        # The reference has no dropout to draw: any fixed key gives its one loss.
        reference_loss, _ = per_position_loss(reference, batch, jax.random.PRNGKey(0), z_loss_weight)
        batch["reference_loss"] = jax.lax.stop_gradient(reference_loss)
        batch["domain_weights"] = opt_state.weights
        new_state, metrics = train_step(state, batch, frozen)
        kept = metrics["nonfinite"] > 0
        weights = jnp.where(kept, opt_state.weights, metrics["domain_weights"])
        metrics["domain_weights"] = weights
        new_opt = new_state.opt_state._replace(weights=weights, weight_sum=opt_state.weight_sum + weights)
        return dataclasses.replace(new_state, opt_state=new_opt), metrics

    return step
