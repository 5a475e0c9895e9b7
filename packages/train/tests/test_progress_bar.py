"""The run's progress bar counts completed steps (not dispatched ones) and times only the steps after the
first, which compiles (issue 34: it jumped and stalled at every logging step, its ETA swung wildly)."""

from __future__ import annotations

import io

from tqdm import tqdm

from halyard.train.trainer.progress import StepProgress


class StepMetrics:
    """A step's metrics as the host holds them: ready once the device has finished the step."""

    def __init__(self) -> None:
        self.ready = False

    def is_ready(self) -> bool:
        return self.ready


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def progress(total: int, start_step: int, clock: Clock) -> StepProgress:
    bar = tqdm(total=total, initial=start_step, file=io.StringIO(), smoothing=0, mininterval=0)
    bar._time = clock  # type: ignore[method-assign]  (tqdm reads its time through this attribute)
    bar.start_t = bar.last_print_t = clock()
    return StepProgress(total, start_step, bar=bar)


def test_the_bar_counts_steps_as_they_complete_not_as_they_are_dispatched() -> None:
    clock = Clock()
    shown = progress(20, 0, clock)
    steps = {step: StepMetrics() for step in range(1, 21)}
    for step in (1, 2, 3):
        shown.dispatched(step, {"loss": steps[step]})
    assert shown.bar.n == 0  # three steps dispatched, none finished
    steps[1].ready = True
    shown.dispatched(4, {"loss": steps[4]})
    assert shown.bar.n == 1
    steps[2].ready = steps[3].ready = True
    shown.dispatched(5, {"loss": steps[5]})
    assert shown.bar.n == 3  # step 4 is still running
    shown.completed_through(5)  # a logging step: the host waited for step 5
    assert shown.bar.n == 5
    shown.dispatched(6, {"loss": steps[6]})
    assert shown.bar.n == 5


def test_the_rate_and_time_left_leave_out_the_first_step() -> None:
    clock = Clock()
    shown = progress(101, 1, clock)  # resumed at step 1
    clock.now = 120.0  # the first step of this start compiles for two minutes
    shown.completed_through(2)
    for step in range(3, 13):
        clock.now += 0.5
        shown.completed_through(step)
    meter = shown.bar.format_dict
    assert meter["n"] - meter["initial"] == 10  # the steps after the first ...
    assert meter["elapsed"] == 5.0  # ... in the time after the first
    # 89 steps left at 2 steps a second, not at (120 + 5) / 11 s a step:
    assert "<00:44" in tqdm.format_meter(**meter)
