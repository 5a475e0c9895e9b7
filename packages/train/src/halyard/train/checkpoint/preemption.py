"""Preemption: SIGTERM (or Ctrl-C) sets a flag; the training loop polls it, saves synchronously and exits
with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT). A second Ctrl-C interrupts at once.

The handler only sets a flag, because a signal can arrive in the middle of a device computation or of a
checkpoint write, where neither saving nor exiting is safe. The trainer checks the flag between steps::

    flag = install_preemption_handler()
    for step in ...:
        state = train_step(state, batch)
        if flag.requested_on_any_process():
            manager.save(step, state, extra_metadata, wait=True)
            raise SystemExit(flag.exit_code)
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

PREEMPTION_EXIT_CODE = 143
"""Exit status after a preemption save: 128 + SIGTERM (15), what a process killed by SIGTERM reports,
so schedulers (Slurm, Kubernetes) treat it as the preemption it was."""


class PreemptionFlag:
    """Set when a preemption signal arrived; safe to poll from the training loop at every step."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_number: int | None = None
        self._previous_handlers: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a preemption signal arrived on this process."""
        return self._event.is_set()

    def set(self, signal_number: int | None = None) -> None:
        """Mark preemption as requested (what the signal handler does; also usable by tests or a watchdog).

        Args:
            signal_number: the signal that asked for it, if any.
        """
        self.signal_number = signal_number
        self._event.set()

    @property
    def exit_code(self) -> int:
        """What the process should exit with after its save: 128 + the signal's number, as a process killed
        by that signal reports (143 when no signal reached this process, e.g. only another process's did)."""
        return 128 + self.signal_number if self.signal_number is not None else PREEMPTION_EXIT_CODE

    def requested_on_any_process(self, agree: Callable[[bool], bool] | None = None) -> bool:
        """Whether any process received the signal, agreed on by all (call it on every process together).

        Args:
            agree: the collective that combines the processes' flags; the default is a no-op with one
                process and an all-gather otherwise.
        """
        if agree is None:
            # Here, not at the top: `train` installs the handler before jax is imported (jax's import takes
            # seconds, and a Ctrl-C during it must stop the run too).
            from halyard.train.checkpoint.process_agreement import true_on_any_process

            agree = true_on_any_process
        return agree(self.requested)

    @property
    def signal_name(self) -> str | None:
        """The name of the signal that arrived (``SIGINT``, ``SIGTERM``), or None."""
        return signal.Signals(self.signal_number).name if self.signal_number is not None else None

    def uninstall(self) -> None:
        """Put back the signal handlers that were there before `install_preemption_handler`."""
        for signal_number, handler in self._previous_handlers.items():
            signal.signal(signal_number, handler)
        self._previous_handlers.clear()

    def reinstall(self) -> None:
        """Take the signals back after a library replaced their handlers (``jax.distributed.initialize``
        installs its own SIGTERM handler, which would otherwise swallow a preemption)."""
        for signal_number in self._previous_handlers:
            signal.signal(signal_number, self._handle)

    def _handle(self, signal_number: int, frame: FrameType | None) -> None:
        if signal_number == signal.SIGINT and self.requested:
            # Ctrl-C twice: the user does not want to wait for the save.
            raise KeyboardInterrupt
        self.set(signal_number)


def install_preemption_handler(signals: Sequence[int] = (signal.SIGTERM,)) -> PreemptionFlag:
    """Install handlers that turn the given signals into a `PreemptionFlag` instead of a sudden death.

    Args:
        signals: the signals meaning "you are about to be preempted" (SIGTERM by default; the trainer
            adds ``signal.SIGINT``, so Ctrl-C saves too; add ``signal.SIGUSR1`` for schedulers configured
            to send it ahead of time).

    Returns:
        The flag to poll; ``flag.uninstall()`` restores the previous handlers.

    Raises:
        ValueError: when called outside the main thread (Python only lets the main thread set handlers).
    """
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("install_preemption_handler must be called from the main thread (Python's rule)")
    flag = PreemptionFlag()
    for signal_number in signals:
        flag._previous_handlers[signal_number] = signal.signal(signal_number, flag._handle)
    return flag
