"""The progress bar of a run: it counts completed steps, not dispatched ones, and its rate and time left
count only the steps after the first (whose compilation would skew them for the whole run)."""

from __future__ import annotations

from collections import deque
from typing import Any

import jax
from tqdm import tqdm


def _is_ready(metrics: Any) -> bool:
    """Whether the step that produced ``metrics`` has finished on the device (without waiting for it)."""
    leaves = jax.tree_util.tree_leaves(metrics)
    return not leaves or all(leaf.is_ready() for leaf in leaves if hasattr(leaf, "is_ready"))


class StepProgress:
    """A tqdm bar over the run's steps, advanced as steps complete on the device.

    Steps run asynchronously: the host dispatches a step before the device has finished the previous ones,
    and waits for them only where it fetches metrics. Counting dispatched steps makes the bar run ahead and
    then stall at every fetch; this bar counts a step when its metrics are ready.

    Args:
        total: ``trainer.steps``.
        start_step: the step the run starts from (a resumed run starts later).
        bar: the tqdm bar to drive (default: a new one on stderr).
    """

    def __init__(self, total: int, start_step: int, *, bar: tqdm | None = None) -> None:
        # smoothing=0: the rate is the mean since the timing started (after the first step), not an
        # average that a checkpoint or an evaluation throws about.
        self.bar = bar or tqdm(total=total, initial=start_step, unit="step", dynamic_ncols=True, smoothing=0)
        self.start_step = start_step
        self._dispatched: deque[tuple[int, Any]] = deque()
        self._timing = False

    def dispatched(self, step: int, metrics: Any) -> None:
        """Note step ``step`` (1-based) as dispatched, and count the steps that completed meanwhile."""
        self._dispatched.append((step, metrics))
        while self._dispatched and _is_ready(self._dispatched[0][1]):
            self._completed(self._dispatched.popleft()[0])

    def completed_through(self, step: int) -> None:
        """Count every step up to ``step`` as completed (the host waited for it)."""
        while self._dispatched and self._dispatched[0][0] <= step:
            self._dispatched.popleft()
        self._completed(step)

    def set_postfix(self, shown: dict[str, str]) -> None:
        self.bar.set_postfix(shown)

    def close(self) -> None:
        self.bar.close()

    def _completed(self, step: int) -> None:
        if step <= self.bar.n:
            return
        if not self._timing:
            # The first step compiles: the rate and the time left start after it.
            self._timing = True
            self.bar.reset(total=self.bar.total)
            self.bar.initial = self.bar.n = self.bar.last_print_n = step
            self.bar.refresh()
            return
        self.bar.update(step - self.bar.n)
