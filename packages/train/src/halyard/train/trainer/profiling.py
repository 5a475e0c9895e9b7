"""An optional profiler trace of a window of steps, written into the run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax


class ProfileWindow:
    """Traces steps ``[start, start + steps)`` with ``jax.profiler`` into ``<run_dir>/profile``.

    Open the trace with TensorBoard's profile plugin or Perfetto. With ``start=None`` it does nothing.

    Args:
        run_dir: the run directory.
        start: the first traced step (0-based, as the loop counts), or None.
        steps: how many steps to trace.
    """

    def __init__(self, run_dir: Path, start: int | None, steps: int) -> None:
        if start is not None and (start < 0 or steps < 1):
            raise ValueError(
                f"trainer.profile_start={start} and trainer.profile_steps={steps} must be >= 0 and >= 1"
            )
        self.directory = run_dir / "profile"
        self.start = start
        self.stop = None if start is None else start + steps
        self.active = False

    def before_step(self, step: int) -> None:
        if self.start is not None and step == self.start and not self.active:
            jax.profiler.start_trace(str(self.directory))
            self.active = True

    def after_step(self, step: int, outputs: Any) -> None:
        if self.active and step + 1 >= (self.stop or 0):
            self.close(outputs)

    def close(self, outputs: Any = None) -> None:
        """Stop a running trace (waiting for ``outputs`` so the traced work is in it)."""
        if self.active:
            if outputs is not None:
                jax.block_until_ready(outputs)
            jax.profiler.stop_trace()
            self.active = False
