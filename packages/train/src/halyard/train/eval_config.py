"""The ``eval:`` section: lm-evaluation-harness tasks run on the weights in memory while training."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EvalConfig:
    """Harness tasks during training: at every ``harness_every`` steps and at the end, on the weights in memory (needs lm-eval)."""

    harness_tasks: list[str] = field(default_factory=list)
    """lm-evaluation-harness task, group or tag names run during training (empty: none); each task's metrics are logged as harness/<task>/<metric> and the results written to <run_dir>/harness/step_<N>.json, as `halyard eval --tasks` writes them."""
    harness_every: int | None = None
    """Run the harness tasks every this many steps, and at the end (null: every trainer.eval_every steps; 0: only at the end)."""
    harness_limit: float | None = None
    """Evaluate the first N examples of each task (a fraction of them when below 1; null: all)."""
    harness_include_path: str | None = None
    """A folder of task YAML files of your own, searched before lm-eval's built-in tasks."""
    harness_num_fewshot: int | None = None
    """Few-shot examples per prompt (null: each task's own setting)."""

    def __post_init__(self) -> None:
        if self.harness_every is not None and self.harness_every < 0:
            raise ValueError(f"eval.harness_every={self.harness_every}: must be >= 0 (0: only at the end)")
        if self.harness_limit is not None and not self.harness_limit > 0:
            raise ValueError(
                f"eval.harness_limit={self.harness_limit}: must be above 0 (a count, or a fraction below 1)"
            )
        if self.harness_num_fewshot is not None and self.harness_num_fewshot < 0:
            raise ValueError(f"eval.harness_num_fewshot={self.harness_num_fewshot}: must be >= 0")
        blank = [name for name in self.harness_tasks if not str(name).strip()]
        if blank:
            raise ValueError(
                "eval.harness_tasks holds an empty name: list lm-eval task names, e.g. [hellaswag]"
            )

    def harness_interval(self, eval_every: int) -> int:
        """Steps between harness evaluations (0: only at the end), given ``trainer.eval_every``."""
        return eval_every if self.harness_every is None else self.harness_every

    def limit(self) -> int | float | None:
        """``harness_limit`` as lm-eval takes it: a whole count as an int, a fraction as a float."""
        value = self.harness_limit
        if value is not None and value >= 1 and float(value).is_integer():
            return int(value)
        return value
