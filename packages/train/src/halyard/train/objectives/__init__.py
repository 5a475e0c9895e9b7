"""Training objectives beyond next-token prediction: direct preference optimisation (DPO).

``trainer.objective: dpo`` with ``data.format: preference`` trains on (prompt, chosen, rejected) pairs
against a frozen reference model, the run's initial weights (see packages/train/README.md, "Preference
optimisation (DPO)").
"""

from halyard.train.objectives.config import OBJECTIVES, DpoConfig
from halyard.train.objectives.dpo import (
    DpoTerms,
    dpo_loss,
    dpo_loss_fn,
    reference_logprobs,
    sequence_logprobs,
)

__all__ = [
    "OBJECTIVES",
    "DpoConfig",
    "DpoTerms",
    "dpo_loss",
    "dpo_loss_fn",
    "reference_logprobs",
    "sequence_logprobs",
]
