"""When to save and which checkpoints to keep: two small, pure policies that tests drive with a fake clock.

Saving: a checkpoint is due every ``every_steps`` steps and/or when ``every_seconds`` have passed since
the last save (time-based saves bound the work lost to a crash when steps are slow or irregular).

Keeping: the newest ``keep_last`` complete checkpoints are kept; older ones survive only if they are
*permanent* (their step is a multiple of ``keep_every_steps``); the others are *temporary* and are deleted
once ``keep_last`` newer checkpoints are durable. As ``keep_last >= 1``, the newest complete checkpoint
is never deleted (and the manager deletes only after a newer one is durable).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SavePolicy:
    """When a checkpoint is due.

    Attributes:
        every_steps: save at steps that are multiples of this (None: no step-based saves).
        every_seconds: save when this many seconds passed since the last save, or since the start for the
            first one (None: no time-based saves).
    """

    every_steps: int | None = None
    every_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_steps <= 0:
            raise ValueError(f"SavePolicy.every_steps must be positive or None, got {self.every_steps}")
        if self.every_seconds is not None and self.every_seconds <= 0:
            raise ValueError(f"SavePolicy.every_seconds must be positive or None, got {self.every_seconds}")

    def is_due(self, step: int, now: float, last_save_step: int | None, last_save_time: float) -> bool:
        """Whether to save at ``step``.

        Args:
            step: the step just completed.
            now: the current time in seconds (any monotonic clock; only differences matter).
            last_save_step: the step of the last save, None before the first one.
            last_save_time: when the last save started (the start of training before the first one).
        """
        if step == last_save_step:
            return False
        if self.every_steps is not None and step % self.every_steps == 0:
            return True
        return self.every_seconds is not None and now - last_save_time >= self.every_seconds


@dataclass(frozen=True)
class KeepPolicy:
    """Which complete checkpoints survive once a newer one is durable.

    Attributes:
        keep_last: how many of the newest complete checkpoints to keep, of any kind (at least 1).
        keep_every_steps: keep forever every checkpoint whose step is a multiple of this (None: none).
    """

    keep_last: int = 1
    keep_every_steps: int | None = None

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(
                f"KeepPolicy.keep_last must be >= 1 (the newest complete checkpoint is always kept), "
                f"got {self.keep_last}"
            )
        if self.keep_every_steps is not None and self.keep_every_steps <= 0:
            raise ValueError(
                f"KeepPolicy.keep_every_steps must be positive or None, got {self.keep_every_steps}"
            )

    def is_permanent(self, step: int) -> bool:
        """Whether ``step`` is kept forever."""
        return self.keep_every_steps is not None and step % self.keep_every_steps == 0

    def steps_to_delete(self, complete_steps: Iterable[int]) -> list[int]:
        """The complete checkpoints to delete, ascending; never the newest one.

        Args:
            complete_steps: steps of the complete checkpoints on disk.
        """
        ordered = sorted(set(complete_steps))
        recent = set(ordered[-self.keep_last :])
        return [step for step in ordered if step not in recent and not self.is_permanent(step)]
