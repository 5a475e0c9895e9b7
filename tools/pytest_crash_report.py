"""A crashed test worker says why: its stacks, the test it was running and the signal, at the end of the run.

Why: a pytest-xdist worker that dies of a native crash (a segfault in jaxlib's CPU runtime, an abort of XLA)
shows up as "worker 'gw2' crashed while running 'test id'" and nothing more: whatever its fault handler wrote
went to the test's captured stderr, which died with the process, or into the middle of the other workers'
output. Under load such crashes happened about once in several full runs, too rarely to reproduce.

How: the controller makes a folder and tells every worker its path. A worker writes, into
``<folder>/<worker id>.log``:

- the test's captured stderr (the file pytest's capture of file descriptor 2 writes into becomes this
  file, so it survives the process), where the native stacks land: jaxlib's fault handler (absl's,
  installed here) writes every thread's C++ stack to file descriptor 2 on SIGSEGV, SIGBUS, SIGILL, SIGFPE
  and SIGABRT, then hands the signal on;
- Python's stacks of every thread (`faulthandler`, enabled into the same file, appending).

When a worker goes down with an error, the controller reads its file and the process's exit signal; at the
end of the run the terminal summary prints, for each crashed worker, the test it was running, the signal
and the file (its last `REPORT_LINES` lines). The folder is removed when the run ends.

Use: ``pytest -n 3 -p tools.pytest_crash_report`` (from the repository root; the Makefile's PYTEST_ARGS).
Without xdist it does nothing: pytest's own faulthandler then writes to the terminal directly.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

FOLDER_KEY = "halyard_crash_folder"
"""The key of xdist's ``workerinput`` that carries the folder to the workers."""
REPORT_LINES = 400
"""The most lines of a crashed worker's file the summary prints (its end: the stacks come last)."""
GIVEN_BACK = (signal.SIGTERM, signal.SIGTRAP)
"""Signals absl's handler takes too, given back their previous handlers: a worker ended on purpose ends as
before, without a stack dump."""


@dataclass
class Crash:
    """One worker that went down with an error.

    Attributes:
        worker: xdist's worker id (``gw2``).
        test: the test it was running, when xdist knew one.
        exit_signal: the signal that ended the process, when it could be read.
        log: the worker's file.
    """

    worker: str
    test: str | None
    exit_signal: str | None
    log: Path


class CrashReport:
    """The controller's side: hands out the folder, collects crashes, prints them at the end."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="pytest-worker-crashes-"))
        self.crashes: dict[str, Crash] = {}

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[FOLDER_KEY] = str(self.folder)

    @pytest.hookimpl(tryfirst=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        if error is None:
            return
        worker = node.gateway.id
        self.crashes[worker] = Crash(worker, None, _exit_signal(node), self.folder / f"{worker}.log")

    @pytest.hookimpl(tryfirst=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        crash = self.crashes.get(report.node.gateway.id)  # type: ignore[attr-defined]
        if crash is not None:
            crash.test = crashitem
            report.longrepr = f"{report.longrepr} (its stacks: 'crashed test workers' at the end of the run)"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.crashes:
            return
        terminalreporter.section("crashed test workers", sep="=", red=True, bold=True)
        for crash in self.crashes.values():
            terminalreporter.line(
                f"worker {crash.worker!r} crashed while running {crash.test or 'no test'!r}, "
                f"signal {crash.exit_signal or _signal_from_log(crash.log) or 'unknown'}"
            )
            terminalreporter.line(_tail(crash.log))

    def pytest_unconfigure(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _exit_signal(node: Any) -> str | None:
    """The name of the signal that ended ``node``'s process, if its exit status can be read within 5 s."""
    popen = getattr(getattr(node.gateway, "_io", None), "popen", None)  # execnet's popen gateway
    if popen is None:
        return None
    deadline = time.monotonic() + 5
    while popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    code = popen.returncode
    if code is None or code >= 0:
        return None if code is None else f"none (exit status {code})"
    with contextlib.suppress(ValueError):
        return signal.Signals(-code).name
    return f"{-code}"


def _signal_from_log(log: Path) -> str | None:
    """The signal Python's fault handler named in ``log`` ("Fatal Python error: Segmentation fault")."""
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        if line.startswith("Fatal Python error: "):
            return line.removeprefix("Fatal Python error: ").strip()
    return None


def _tail(log: Path) -> str:
    if not log.exists() or not log.stat().st_size:
        return (
            "  (nothing was written: the process ended without running a fault handler, as SIGKILL ends it; "
            "the kernel's out-of-memory killer sends it, see dmesg)"
        )
    lines = log.read_text(errors="replace").splitlines()
    cut = f"  ({len(lines) - REPORT_LINES} earlier lines left out)\n" if len(lines) > REPORT_LINES else ""
    return cut + "\n".join(lines[-REPORT_LINES:])


def _write_crashes_to(path: Path, config: pytest.Config) -> Any:
    """In a worker: the captured stderr of file descriptor 2 goes to ``path`` instead of an anonymous file,
    Python's fault handler appends there, and jaxlib's native fault handler is installed.

    Returns:
        The file the fault handler writes to (kept open for the worker's life).
    """
    capture = getattr(config.pluginmanager.getplugin("capturemanager"), "_global_capturing", None)
    stderr_capture = getattr(capture, "err", None)
    if getattr(stderr_capture, "targetfd", None) == 2:  # --capture=fd, pytest's default
        anonymous = stderr_capture.tmpfile.fileno()  # type: ignore[union-attr]
        redirected = os.path.samestat(os.fstat(2), os.fstat(anonymous))
        named = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(named, anonymous)
        os.close(named)
        if redirected:  # capturing now: file descriptor 2 points at the anonymous file too
            os.dup2(anonymous, 2)
    # else: file descriptor 2 is the worker's inherited stderr, the terminal of the run
    stacks = open(path, "a")  # noqa: SIM115 - open for the worker's life, for the fault handler
    faulthandler.enable(file=stacks, all_threads=True)
    kept = {number: signal.getsignal(number) for number in GIVEN_BACK}
    try:
        from jaxlib import utils
    except ImportError:
        return stacks
    utils.install_failure_signal_handler(call_previous_handler=True)  # after faulthandler: it hands on to it
    for number, handler in kept.items():
        signal.signal(number, handler)
    return stacks


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin pointed the handler at the terminal
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if FOLDER_KEY in workerinput:
            path = Path(workerinput[FOLDER_KEY]) / f"{workerinput['workerid']}.log"
            config.stash[_STACKS] = _write_crashes_to(path, config)
    elif config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None):
        config.pluginmanager.register(CrashReport(), "halyard_crash_report")


_STACKS = pytest.StashKey[Any]()
