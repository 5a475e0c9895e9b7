"""Helpers of the reliability suite: the reference run, tiny configs, training in a child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer_fixtures import deep_update, load_config, write_config

from halyard.train.trainer.trainer import Trainer

REFERENCE_STEPS = 8
"""The final step of every run compared with the reference (the cosine schedule depends on it)."""


class Reference:
    """One uninterrupted tiny run with a checkpoint at every step: the bits every faulted run must end with.

    Attributes:
        config_path: its YAML (checkpoint every step, all kept).
        final: the `FitResult` of the uninterrupted run.
    """

    def __init__(self, config_path: Path, final: Any) -> None:
        self.config_path = config_path
        self.final = final
        self._params_by_step: dict[int, Any] = {}

    def params_at(self, step: int) -> Any:
        """The reference parameters after ``step`` steps (restored from its checkpoint)."""
        if step not in self._params_by_step:
            self._params_by_step[step] = Trainer(load_config(self.config_path)).restore_state(step).params
        return self._params_by_step[step]


def tiny_config(tmp: Path, name: str, cache: Path, **sections: dict[str, Any]) -> Path:
    """A tiny run's YAML (``REFERENCE_STEPS`` steps, checkpoint every step) at ``tmp/name.yaml``."""
    base = {"trainer": {"steps": REFERENCE_STEPS}, "checkpoint": {"every_steps": 1, "keep_last": 100}}
    return write_config(tmp / f"{name}.yaml", tmp / name, cache, **deep_update(base, sections))


def start_training(
    config: Path, log: Path, *, setup: str = "", devices: int = 8, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """``train --config CONFIG`` in a child process writing stdout and stderr to ``log``.

    Args:
        config: the run's YAML.
        log: file receiving the child's output (read it with `output`).
        setup: Python code the child runs before training (how faults are injected: monkeypatches).
        devices: simulated CPU devices of the child.
        env: extra environment variables.
    """
    child_env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {os.environ.get('HALYARD_TEST_XLA_COMPILE_FLAGS', '')}",
        JAX_PLATFORMS="cpu",
    )
    child_env.update(env or {})
    code = (
        f"import sys\n{setup}\nfrom halyard.train.cli import train_main\nsys.exit(train_main(sys.argv[1:]))\n"
    )
    with open(log, "w") as handle:
        return subprocess.Popen(
            [sys.executable, "-c", code, "--config", str(config)],
            env=child_env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )


def wait_until(condition: Callable[[], bool], process: subprocess.Popen, timeout: float = 300) -> bool:
    """Poll ``condition`` until it holds (True) or ``process`` exits / ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if condition():
            return True
        time.sleep(0.02)
    return False


def kill_hard(process: subprocess.Popen) -> int:
    """SIGKILL ``process`` (no cleanup, no atexit, no flush) and return its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    return process.wait(timeout=60)


def output(log: Path) -> str:
    """What a child wrote to its log."""
    return log.read_text(errors="replace")


def step_directories(run_dir: Path) -> list[str]:
    """Names of the ``step_*`` folders of a run (complete or not)."""
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.glob("step_*")) if root.exists() else []


def restored_params(config: Path, step: int) -> Any:
    """Parameters of ``config``'s run at checkpoint ``step``, restored onto this process's mesh."""
    return Trainer(load_config(config)).restore_state(step).params


__all__ = ["Reference", "deep_update", "load_config", "tiny_config"]
