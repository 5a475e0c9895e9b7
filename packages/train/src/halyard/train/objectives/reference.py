"""DPO's reference model: the weights the run started from, frozen, and the hook adding its log-probabilities
to every batch before the train step."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from halyard.train.objectives.dpo import reference_logprobs

if TYPE_CHECKING:
    from halyard.train.run_config import TrainConfig

Batch = dict[str, jax.Array]


def reference_hook(config: TrainConfig, reference: Callable[[], Any]) -> Callable[[Batch], Batch]:
    """``batch -> batch`` run before every step: for ``trainer.objective: dpo`` it adds
    `reference_logprobs` of the frozen reference model (one forward without gradients, jitted); for lm it
    returns the batch as it is.

    Args:
        config: the run config.
        reference: builds the reference model's parameters (called once, only for dpo: the weights the run
            started from, which `halyard.train.trainer.session` loads through `halyard.train.run.sources`).
    """
    if config.trainer.objective != "dpo":
        return lambda batch: batch
    params = reference()
    add = jax.jit(lambda model, batch: {**batch, **reference_logprobs(model, batch)})
    return lambda batch: add(params, batch)
