"""Ctrl-C (SIGINT to the whole process group, as a terminal sends it) and SIGTERM stop a ``train`` command at
any moment: while it starts (nothing written), before its first step (nothing to save), during the run (a
checkpoint, then exit 130 or 143), each with one line saying where it stopped and how to go on."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trainer_fixtures import write_config

from halyard.train.checkpoint.discovery import latest_complete

TIMEOUT_S = 300
CODE = "import sys; from halyard.train.cli import train_main; sys.exit(train_main(sys.argv[1:]))"


class TrainProcess:
    """``train --config CONFIG`` in its own process group, its stdout read line by line as it comes."""

    def __init__(self, config: Path) -> None:
        env = dict(
            os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", "")
        )
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-c", CODE, "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # a process group of its own, like a terminal's foreground job
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for_output(self, start: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.process.poll() is None, "train ended before printing " + repr(start)
                continue
            self.stdout.append(line)
            if line.startswith(start):
                return
        raise AssertionError(f"no line starting {start!r} within {TIMEOUT_S} s")

    def handles_sigterm(self) -> bool:
        """Whether the process has a handler for SIGTERM (Python installs none of its own)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        return bool(caught & (1 << (signal.SIGTERM - 1)))

    def signal_group(self, number: int) -> None:
        os.killpg(self.process.pid, number)

    def finish(self) -> tuple[int, str]:
        try:
            _, stderr = self.process.communicate(timeout=TIMEOUT_S)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode, stderr


def last_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.strip()][-1]


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max((int(record.get("step", 0)) for record in records), default=0)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal handlers from /proc")
def test_ctrl_c_while_train_starts_stops_at_once_and_writes_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache")
    train = TrainProcess(config)
    # As soon as the command handles SIGTERM (it does from its first moment): jax is still being imported,
    # seconds before anything is printed. The 60 s cap only ends a wait for a handler that never comes (the
    # exit code then fails below); a loaded machine can take seconds to start Python.
    while not train.handles_sigterm() and time.monotonic() - train.started < 60:
        time.sleep(0.02)
    train.signal_group(signal.SIGINT)
    code, stderr = train.finish()
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert last_line(stderr) == "interrupted before the run started; nothing was written"
    assert not (tmp_path / "run").exists()


def test_ctrl_c_before_the_first_step_saves_nothing_and_the_same_command_starts_again(tmp_path: Path) -> None:
    # Builder worker processes too: the group's Ctrl-C must not kill them mid-import with a traceback.
    config = write_config(
        tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache", data={"num_workers": 2}
    )
    train = TrainProcess(config)
    train.wait_for_output("data: building the token cache")  # the run folder exists; no step has run
    train.signal_group(signal.SIGINT)
    code, stderr = train.finish()
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert (
        last_line(stderr) == "interrupted before step 1; nothing to save; run the same command to start again"
    )
    assert latest_complete(tmp_path / "run" / "checkpoints") is None
    assert steps_logged(tmp_path / "run") == 0


@pytest.mark.parametrize(
    ("number", "code", "what"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
)
def test_a_signal_during_the_run_saves_says_where_and_the_same_command_resumes(
    tmp_path: Path, number: int, code: int, what: str
) -> None:
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        run_dir,
        tmp_path / "cache",
        trainer={"steps": 150, "log_every": 1},
        checkpoint={"every_steps": 1000},  # the only checkpoint is the one the signal asks for
    )
    train = TrainProcess(config)
    deadline = time.monotonic() + TIMEOUT_S
    while steps_logged(run_dir) < 2:
        assert train.process.poll() is None and time.monotonic() < deadline, train.finish()
        time.sleep(0.05)
    train.signal_group(number)
    returned, stderr = train.finish()
    assert returned == code, stderr[-3000:]
    assert "Traceback" not in stderr
    match = re.fullmatch(
        rf"{what} at step (\d+); checkpoint saved; run the same command to resume", last_line(stderr)
    )
    assert match is not None, stderr[-3000:]
    step = int(match.group(1))
    assert 2 <= step < 150
    assert latest_complete(run_dir / "checkpoints") == step
    if number == signal.SIGINT:  # the same command resumes and finishes
        resumed = subprocess.run(
            [sys.executable, "-c", CODE, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=dict(os.environ, JAX_PLATFORMS="cpu"),
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert latest_complete(run_dir / "checkpoints") == 150
