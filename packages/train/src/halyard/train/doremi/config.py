"""The ``doremi:`` section (with ``trainer.objective: doremi``) and what such a run needs of the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DoremiConfig:
    """DoReMi's proxy run (with trainer.objective: doremi): Group DRO over the mixture's sources against a reference model, learning their weights (docs/guides/doremi; `halyard doremi` runs the reference, this and the main run's command)."""

    reference: str = ""
    """The reference model: a run folder, its checkpoints/ folder or a step folder (a model of the same shape as this one, trained on the mixture's data.mixture.weights); its latest complete checkpoint's weights stay frozen."""
    step_size: float = 1.0
    """The exponentiated-gradient step on the domains' excess losses (the paper's 1)."""
    smoothing: float = 1e-3
    """The share of the uniform distribution mixed into the weights after every step (the paper's 1e-3), in [0, 1)."""

    def __post_init__(self) -> None:
        if not self.step_size > 0:
            raise ValueError(f"doremi.step_size={self.step_size}: must be positive (the paper's 1)")
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"doremi.smoothing={self.smoothing}: must be in [0, 1) (the paper's 1e-3)")


def check_doremi_run(config: Any) -> None:
    """Check that a ``trainer.objective: doremi`` run can train (called by `TrainConfig`).

    Raises:
        ValueError: one line naming the key: no data.mixture, no doremi.reference, trainer.accumulation above
            1 (the weights step on the whole batch's losses), trainer.invariant or lora.rank (not supported).
    """
    if config.trainer.objective != "doremi":
        return
    if not config.data.mixture.sources:
        raise ValueError(
            "trainer.objective=doremi learns the weights of a mixture's sources: give data.mixture.sources "
            "(at least two) and their reference weights"
        )
    if not config.doremi.reference:
        raise ValueError(
            "doremi.reference is empty: give the reference run's folder (trained on the same mixture), or run "
            "`halyard doremi --config C`, which trains one first"
        )
    if config.trainer.accumulation != 1:
        raise ValueError(
            f"trainer.accumulation={config.trainer.accumulation}: trainer.objective=doremi steps the domain "
            "weights on the whole batch's losses; use trainer.accumulation: 1 (a smaller batch_size if it does not fit)"
        )
    if config.trainer.invariant:
        raise ValueError("trainer.invariant: not supported with trainer.objective=doremi; set it to false")
    if config.lora.enabled:
        raise ValueError(
            "lora.rank > 0: trainer.objective=doremi trains the whole proxy model; set lora.rank: 0"
        )
