"""The training objective's settings: ``trainer.objective`` and the ``dpo:`` section."""

from __future__ import annotations

from dataclasses import dataclass

OBJECTIVES = ("lm", "dpo", "grpo", "doremi")


@dataclass(frozen=True)
class DpoConfig:
    """Direct preference optimisation (with trainer.objective: dpo): prefer the chosen replies over the rejected ones, relative to a frozen reference model (the run's initial weights)."""

    beta: float = 0.1
    """How far the model may move from the reference: the loss is -log sigmoid(beta * margin), the margin being the chosen reply's summed log-probability gain over the reference minus the rejected reply's; a higher beta keeps the model closer to the reference."""
    label_smoothing: float = 0.0
    """The share of pairs assumed to be labelled the wrong way round (conservative DPO): the loss becomes -(1 - s) log sigmoid(beta * margin) - s log sigmoid(-beta * margin); 0 is plain DPO; in [0, 0.5)."""

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ValueError(f"dpo.beta={self.beta}: must be positive (0.1 is the usual start)")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"dpo.label_smoothing={self.label_smoothing}: must be in [0, 0.5)")


def check_objective_data(objective: str, data_format: str) -> None:
    """Check that ``trainer.objective`` and ``data.format`` go together.

    Raises:
        ValueError: dpo without preference data, or preference data without dpo.
    """
    if objective == "dpo" and data_format != "preference":
        raise ValueError(
            f"trainer.objective=dpo trains on preference pairs but data.format={data_format!r}: set "
            "data.format=preference (jsonl records with prompt, chosen and rejected)"
        )
    if objective == "grpo" and data_format != "prompts":
        raise ValueError(
            f"trainer.objective=grpo samples completions of prompts but data.format={data_format!r}: set "
            "data.format=prompts (records with a prompt and an answer)"
        )
    if data_format == "prompts" and objective != "grpo":
        raise ValueError(
            f"data.format=prompts holds prompts to sample from, which trainer.objective={objective!r} cannot "
            "train on: set trainer.objective=grpo"
        )
    if data_format == "preference" and objective != "dpo":
        raise ValueError(
            f"data.format=preference holds pairs to compare, which trainer.objective={objective!r} cannot "
            "train on: set trainer.objective=dpo"
        )
