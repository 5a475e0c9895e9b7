"""What a LoRA run trains: the adapters (the train state's parameters), joined to the frozen base for
the loss, with dropout keys drawn from the step's key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from halyard.models.lora import LoraConfig, init_lora, lora_params, with_dropout_keys, with_lora
from halyard.train.step import LossFn, TrainState

ADAPTER_STREAM = 0x10A
"""Folded into the run's key for the adapters' A, so they draw apart from the model's initialisation."""


def trainable_params(lora: LoraConfig, init_model: Callable[[jax.Array], Any], key: jax.Array) -> Any:
    """What the train state holds: the model ``init_model(key)``, or with LoRA its fresh adapters
    (``{"q_proj": LoraAdapter, ...}``, drawn from ``fold_in(key, ADAPTER_STREAM)``; the base is only
    traced for its shapes).

    Args:
        lora: the ``lora:`` section.
        init_model: the model config's ``init``.
        key: the run's initialisation key.
    """
    if not lora.enabled:
        return init_model(key)
    shapes = jax.eval_shape(init_model, key)
    return init_lora(shapes, lora, key=jax.random.fold_in(key, ADAPTER_STREAM))


def join(frozen: Any, adapters: Any) -> Any:
    """The model the loss sees: the frozen base with the trained adapters (`make_train_step`'s ``join``)."""
    return with_lora(frozen, adapters)


def with_base(state: TrainState, frozen: Any) -> TrainState:
    """``state`` with its parameters the whole model (the base joined with the adapters) when ``frozen``
    is a LoRA run's base; ``state`` itself without one."""
    if frozen is None:
        return state
    return TrainState(
        step=state.step,
        params=join(frozen, state.params),
        opt_state=state.opt_state,
        key=state.key,
        nonfinite_steps=state.nonfinite_steps,
    )


def lora_loss_fn(loss_fn: LossFn, lora: LoraConfig) -> LossFn:
    """``loss_fn`` with the adapters' dropout masks drawn from the step's key (``lora.dropout`` > 0);
    ``loss_fn`` itself otherwise."""
    if not (lora.enabled and lora.dropout):
        return loss_fn

    def with_dropout(model: Any, batch: dict[str, jax.Array], key: jax.Array) -> Any:
        dropout_key, loss_key = jax.random.split(key)
        keyed = with_dropout_keys(lora_params(model), dropout_key)
        return loss_fn(with_lora(model, keyed), batch, loss_key)

    return with_dropout
