"""Stopping a run on Ctrl-C or SIGTERM at any moment: one line on stderr saying where it stopped and how to
go on, then the exit code of the signal (130 for Ctrl-C, 143 for SIGTERM).

    interrupted at step 12; checkpoint saved; run the same command to resume
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

from halyard.train.checkpoint.process_agreement import true_on_any_process


def signalled_on_any_process(preemption: Any) -> bool:
    """Whether a signal arrived on any process (a collective: every process calls it at the same point).

    The polls outside the step loop read the flag itself, not ``requested_on_any_process``, whose calls a
    test's flag may count as steps.
    """
    return true_on_any_process(bool(getattr(preemption, "requested", False)))


class RunInterrupted(SystemExit):
    """The run stopped on a signal; `report` prints the line saying where (once, after the cleanup)."""

    def __init__(self, code: int, line: str | None) -> None:
        super().__init__(code)
        self.line = line

    def report(self) -> None:
        """Print the line on stderr (the first call only; nothing on processes other than the main one)."""
        if self.line is not None:
            print(self.line, file=sys.stderr, flush=True)
            self.line = None


def stop_run(preemption: Any, where: str, *, main: bool = True, report: bool = False) -> NoReturn:
    """Stop the run with the preemption's exit code and the line ``<what happened> <where>``.

    Args:
        preemption: the run's `PreemptionFlag` (or an object with its ``exit_code``).
        where: the rest of the line: the step, what was saved and how to go on.
        main: whether this process reports (process 0 of a run of several).
        report: print the line now (else the caller calls `RunInterrupted.report` after its cleanup).

    Raises:
        RunInterrupted: always, with ``preemption.exit_code``.
    """
    interrupted = RunInterrupted(
        preemption.exit_code, f"{_what_happened(preemption)} {where}" if main else None
    )
    if report:
        interrupted.report()
    raise interrupted


def before_steps(start_step: int) -> str:
    """Where a run stopped before its first step of this start (the state was at ``start_step``)."""
    if start_step == 0:
        return "before step 1; nothing to save; run the same command to start again"
    return f"before step {start_step + 1}; the checkpoint of step {start_step} is kept; run the same command to resume"


def _what_happened(preemption: Any) -> str:
    name = getattr(preemption, "signal_name", None)
    if name == "SIGINT":
        return "interrupted"
    if name is None:
        return "stopped (another process of the run received a signal)"
    return f"stopped by {name}"
