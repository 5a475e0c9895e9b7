"""The evaluations a run makes as it trains: validation (``trainer.eval_every``) and lm-eval harness tasks
(``eval.harness_every``), behind one small interface the loop calls after every step and at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class PeriodicEvaluation(Protocol):
    """An evaluation the loop runs when `due` and once more at the end, unless it ran at the last step."""

    last_step: int | None
    """The step it last evaluated (None: not yet)."""

    def due(self, step: int) -> bool:
        """Whether to evaluate after ``step`` steps."""
        ...

    def evaluate(self, model: Any, step: int) -> tuple[dict[str, float], float]:
        """``(metrics, seconds taken)`` for ``model`` (the whole model) after ``step`` steps."""
        ...


class Validator(Protocol):
    """A validation of the run's objective: `halyard.train.objectives.run_objective.objective_evaluator`."""

    def evaluate(self, model: Any) -> tuple[dict[str, float], float]: ...


@dataclass
class PeriodicValidation:
    """Validation every ``every`` steps (0: only at the end).

    Args:
        validator: the objective's evaluator on the validation split.
        every: ``trainer.eval_every``.
    """

    validator: Validator
    every: int
    last_step: int | None = None

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def evaluate(self, model: Any, step: int) -> tuple[dict[str, float], float]:
        self.last_step = step
        return self.validator.evaluate(model)
