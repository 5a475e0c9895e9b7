"""Goodput: where a run's wall time went (first step and compilation, steps, checkpoints, eval, waiting
for data, sampling rollouts and compiling their programs, other).

    goodput = Goodput()                 # the clock starts here: create it when the run starts
    with goodput.step():                # block on the step's result inside, or time measures dispatch
        state, metrics = train_step(state, batch); float(metrics["loss"])
    with goodput.checkpoint(): save(...)
    with goodput.evaluation(): evaluate(...)
    with goodput.data_wait(): batch = next(loader)   # blocked on a cache that is still being built
    goodput.add("rollout", 5.0); goodput.add("compilation", 40.0)   # GRPO's sampling, the engine's compiles
    tracker.log_summary(goodput.summary())

The first step is counted apart (`first_step_seconds`, mostly compilation) and ends `time_to_first_step`;
`step_fraction` is the time in the other steps over the total wall time: the run's goodput.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

STEP, CHECKPOINT, EVALUATION, DATA_WAIT = "step", "checkpoint", "evaluation", "data_wait"
ROLLOUT, COMPILATION = "rollout", "compilation"
"""GRPO's sampling of rollouts with the inference engine, and the engine compiling its step programs (outside
the train step, whose first compilation the first step holds)."""


class Goodput:
    """Accumulates wall time by activity; the clock is injectable so tests can drive it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        """Start the run's clock now.

        Args:
            clock: a monotonic seconds counter.
        """
        self._clock = clock
        self._start = clock()
        self._seconds = {
            STEP: 0.0,
            CHECKPOINT: 0.0,
            EVALUATION: 0.0,
            DATA_WAIT: 0.0,
            ROLLOUT: 0.0,
            COMPILATION: 0.0,
        }
        self.num_steps = 0
        self.first_step_seconds: float | None = None
        self.time_to_first_step: float | None = None

    def add(self, activity: str, seconds: float, num_steps: int = 1) -> None:
        """Record `seconds` spent in `activity` (`step`, `checkpoint`, `evaluation`, `data_wait`, `rollout`,
        `compilation`), timed by the caller.

        Args:
            activity: one of `step`, `checkpoint`, `evaluation`, `data_wait`, `rollout` (sampling GRPO's
                rollouts), `compilation` (compiling programs outside the train step: the engine's).
            seconds: wall time spent.
            num_steps: for `step`, how many optimizer steps the time covers.

        Raises:
            ValueError: an unknown activity or negative time.
        """
        if activity not in self._seconds:
            raise ValueError(f"unknown activity '{activity}'; use one of {', '.join(self._seconds)}.")
        if seconds < 0:
            raise ValueError(f"time spent must be non-negative, got {seconds}.")
        if activity == STEP and self.first_step_seconds is None:
            self.first_step_seconds = seconds
            self.time_to_first_step = self._clock() - self._start
        else:
            self._seconds[activity] += seconds
        if activity == STEP:
            self.num_steps += num_steps

    @contextlib.contextmanager
    def _timed(self, activity: str, num_steps: int = 1) -> Iterator[None]:
        start = self._clock()
        try:
            yield
        finally:
            self.add(activity, self._clock() - start, num_steps)

    def step(self, num_steps: int = 1) -> contextlib.AbstractContextManager[None]:
        """Time a training step (or `num_steps` of them run together)."""
        return self._timed(STEP, num_steps)

    def checkpoint(self) -> contextlib.AbstractContextManager[None]:
        """Time the part of a checkpoint save that blocks training."""
        return self._timed(CHECKPOINT)

    def evaluation(self) -> contextlib.AbstractContextManager[None]:
        """Time an evaluation pass."""
        return self._timed(EVALUATION)

    def data_wait(self) -> contextlib.AbstractContextManager[None]:
        """Time training spent waiting for batches (the token cache still being built)."""
        return self._timed(DATA_WAIT)

    def summary(self) -> dict[str, float | int]:
        """The accounting so far, under `goodput/` names ready for `Tracker.log_summary`.

        Keys: `total_seconds`, `time_to_first_step_seconds`, `first_step_seconds`, `step_seconds` (steps
        after the first), `checkpoint_seconds`, `evaluation_seconds`, `data_wait_seconds` (waiting for
        data), `rollout_seconds` (sampling rollouts), `compilation_seconds` (the engine's programs),
        `other_seconds` (logging, setup before the first step...), `step_fraction` (`step_seconds / total_seconds`),
        `num_steps`.
        """
        total = self._clock() - self._start
        first = self.first_step_seconds or 0.0
        accounted = first + sum(self._seconds.values())
        return {
            "goodput/total_seconds": total,
            "goodput/time_to_first_step_seconds": self.time_to_first_step or 0.0,
            "goodput/first_step_seconds": first,
            "goodput/step_seconds": self._seconds[STEP],
            "goodput/checkpoint_seconds": self._seconds[CHECKPOINT],
            "goodput/evaluation_seconds": self._seconds[EVALUATION],
            "goodput/data_wait_seconds": self._seconds[DATA_WAIT],
            "goodput/rollout_seconds": self._seconds[ROLLOUT],
            "goodput/compilation_seconds": self._seconds[COMPILATION],
            "goodput/other_seconds": max(0.0, total - accounted),
            "goodput/step_fraction": self._seconds[STEP] / total if total > 0 else 0.0,
            "goodput/num_steps": self.num_steps,
        }

    def summary_text(self) -> str:
        """A few human-readable lines for the end of a run."""
        s = self.summary()
        total = s["goodput/total_seconds"]

        def share(key: str) -> str:
            return f"{s[key]:9.1f} s  ({100 * s[key] / total:5.1f}%)" if total > 0 else f"{s[key]:9.1f} s"

        return "\n".join(
            [
                f"goodput: {100 * s['goodput/step_fraction']:.1f}% of {total:.1f} s in training steps "
                f"({s['goodput/num_steps']} steps)",
                f"  time to first step {s['goodput/time_to_first_step_seconds']:9.1f} s",
                f"  first step         {share('goodput/first_step_seconds')}",
                f"  later steps        {share('goodput/step_seconds')}",
                f"  checkpoints        {share('goodput/checkpoint_seconds')}",
                f"  evaluation         {share('goodput/evaluation_seconds')}",
                f"  waiting for data   {share('goodput/data_wait_seconds')}",
                *(
                    [
                        f"  sampling rollouts  {share('goodput/rollout_seconds')}",
                        f"  compiling engine   {share('goodput/compilation_seconds')}",
                    ]
                    if s["goodput/rollout_seconds"] or s["goodput/compilation_seconds"]
                    else []
                ),
                f"  other              {share('goodput/other_seconds')}",
            ]
        )
