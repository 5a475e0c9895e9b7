"""The steps a run's learning-rate schedule spans, also when a finished run continues to a higher
``trainer.steps``.

A schedule is planned in segments, ``(start, end)`` steps each running the configured schedule (its warmup,
then its shape) over ``end - start`` steps; after the last segment's end the learning rate stays at its final
value. A fresh run has one segment, ``(0, trainer.steps)``. Every checkpoint records the segments, so that
the next start knows where the schedule ended:

- resumed inside the last segment (an interrupted run), the segment ends at ``trainer.steps`` (the same
  value: the same schedule, bit for bit; another value: the schedule stretched or shrunk, as planned anew);
- resumed at or after its end (a finished run continued), ``trainer.continue_schedule`` decides: ``hold``
  keeps the segments (the learning rate stays where the schedule ended), ``restart`` adds the segment
  ``(resumed step, trainer.steps)``: a new warmup, then the shape again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import optax
import yaml

from halyard.train.checkpoint.commit_marker import DamagedCheckpointError, read_commit_marker
from halyard.train.checkpoint.discovery import latest_complete
from halyard.train.checkpoint.layout import step_directory
from halyard.train.run_config import TrainConfig

Segment = tuple[int, int]
METADATA_KEY = "schedule_segments"
"""The checkpoint metadata key of the segments (a list of ``[start, end]``)."""


@dataclass(frozen=True)
class SchedulePlan:
    """The segments of a run's schedule and, when the run continues past a finished schedule, why.

    Attributes:
        segments: ``(start, end)`` steps, increasing; each runs the configured schedule over its length.
        resumed_step: the step of the checkpoint the run resumes (None: a fresh start).
        continued: the run continues after the end of its finished schedule.
    """

    segments: tuple[Segment, ...]
    resumed_step: int | None = None
    continued: bool = False

    @property
    def last_length(self) -> int:
        """The steps of the last segment (what its warmup and decay are measured against)."""
        start, end = self.segments[-1]
        return end - start

    def metadata(self) -> dict[str, list[list[int]]]:
        """What each checkpoint records of the plan (its segments), for the next start to read."""
        return {METADATA_KEY: [[start, end] for start, end in self.segments]}

    def schedule(self, build: Callable[[int], optax.Schedule]) -> optax.Schedule:
        """The learning rate by update count: ``build(length)`` for each segment, joined at their starts."""
        schedules = [build(end - start) for start, end in self.segments]
        if len(schedules) == 1:
            return schedules[0]
        return optax.join_schedules(schedules, [start for start, _ in self.segments[1:]])

    def describe(self, schedule: optax.Schedule, steps: int, mode: str, peak: float) -> str | None:
        """The line saying what the learning rate does from the resumed step on (None: nothing new).

        Args:
            schedule: the run's schedule (`schedule`).
            steps: ``trainer.steps``.
            mode: ``trainer.continue_schedule``.
            peak: ``optimizer.learning_rate``.
        """
        if not self.continued or self.resumed_step is None or steps <= self.resumed_step:
            return None
        added = f"steps {self.resumed_step + 1}-{steps}"
        if mode == "restart":
            ended = self.segments[-2][1] if len(self.segments) > 1 else self.segments[-1][1]
            return (
                f"learning rate: the run's schedule ended at step {ended}; {added} run it again "
                f"(warmup to {peak:.3g}, then its decay) (trainer.continue_schedule=restart; hold keeps the "
                "last learning rate)"
            )
        final = float(schedule(self.segments[-1][1] - 1))
        return (
            f"learning rate: the run's schedule ended at step {self.segments[-1][1]}; {added} keep its last "
            f"learning rate, {final:.3g} (trainer.continue_schedule=hold; restart warms up and decays again)"
        )


def plan_segments(
    previous: Sequence[Segment] | None, resumed_step: int | None, steps: int, mode: str
) -> SchedulePlan:
    """The segments of a run that starts at ``resumed_step`` (None: fresh) towards ``steps``.

    Args:
        previous: the segments the resumed checkpoint records (None: a fresh run, or a checkpoint written
            before segments were recorded, which plans one segment over ``steps`` as before).
        resumed_step: the checkpoint's step.
        steps: ``trainer.steps``.
        mode: ``trainer.continue_schedule`` (``hold`` or ``restart``).
    """
    steps = max(steps, 1)
    if not previous or resumed_step is None:
        return SchedulePlan(((0, steps),), resumed_step)
    segments = [(int(start), int(end)) for start, end in previous]
    start, end = segments[-1]
    if resumed_step < end:  # interrupted inside its schedule
        segments[-1] = (start, max(steps, start + 1))
        return SchedulePlan(tuple(segments), resumed_step)
    if mode == "restart" and steps > resumed_step:
        segments.append((resumed_step, steps))
    return SchedulePlan(tuple(segments), resumed_step, continued=True)


def run_schedule_plan(config: TrainConfig) -> SchedulePlan:
    """The plan of ``config``'s run: from the segments its run folder's latest checkpoint records."""
    cfg = config.trainer
    checkpoints = Path(cfg.run_dir) / "checkpoints"
    latest = latest_complete(checkpoints) if cfg.init != "scratch" and checkpoints.is_dir() else None
    previous = None
    if latest is not None:
        try:
            previous = read_commit_marker(step_directory(checkpoints, latest)).extra_metadata.get(
                METADATA_KEY
            )
        except DamagedCheckpointError:  # restoring reports it (or falls back to an older checkpoint)
            previous = None
        if previous is None:  # written before checkpoints recorded it: the run's last trainer.steps
            previous = _steps_of_saved_config(Path(cfg.run_dir) / "config.yaml")
    return plan_segments(previous, latest, cfg.steps, cfg.continue_schedule)


def _steps_of_saved_config(path: Path) -> list[Segment] | None:
    """``[(0, trainer.steps)]`` of the config a run folder saved at its last start, if it can be read."""
    try:
        steps = yaml.safe_load(path.read_text())["trainer"]["steps"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return [(0, int(steps))] if isinstance(steps, int) and steps > 0 else None
