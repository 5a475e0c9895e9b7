"""On a TPU chip (marker ``tpu``; skipped elsewhere): bitwise-reproducible training, kill -9 and resume to the
uninterrupted run's bits, checkpoints saved and restored, and the commands other than `train` start there.

Run there with (README.md, "On a TPU")::

    python3 -m pytest -p no:cacheprovider -q -m tpu packages/train/tests/test_on_tpu.py

This process stays on the CPU (conftest.py sets ``JAX_PLATFORMS=cpu``); each `train` / `halyard` it starts
holds the chip alone (only one process can), with the TPU host's own environment (its ``TPU_*`` variables).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_fixtures import write_config

from halyard.train.checkpoint.discovery import latest_complete, scan_checkpoints

pytestmark = pytest.mark.tpu

STEPS = 8
COMMAND = "import sys; from halyard.train.cli import main; sys.exit(main(sys.argv[1:]))"


def on_the_chip() -> dict[str, str]:
    """The environment of a process that runs on the TPU (no CPU-only settings of the test suite);
    ``HALYARD_TEST_TPU_PLATFORMS=cpu`` (with ``HALYARD_TEST_TPU=1``) rehearses these tests on a CPU."""
    platforms = os.environ.get("HALYARD_TEST_TPU_PLATFORMS", "tpu,cpu")
    env = dict(os.environ, JAX_PLATFORMS=platforms, XLA_FLAGS="")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # every process compiles: nothing read from earlier runs
    return env


def halyard(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=on_the_chip(),
    )


def config(folder: Path, name: str) -> Path:
    """The tiny run (trainer_fixtures.TINY) at 8 steps, a checkpoint every 2, in ``folder/name``."""
    return write_config(
        folder / f"{name}.yaml",
        folder / name,
        folder / "cache",
        data={"validation_fraction": 0.05},
        trainer={"steps": STEPS, "compilation_cache": None},
        checkpoint={"every_steps": 2, "keep_last": 10},
    )


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """Each logged step's loss; a step logged twice (before a kill and after the resume) must agree."""
    losses: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            step = int(record["step"])
            assert losses.setdefault(step, record["loss"]) == record["loss"], (
                f"step {step} logged twice, unequal"
            )
    return losses


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted tiny run on the chip; its run folder."""
    folder = tmp_path_factory.mktemp("on-tpu")
    result = halyard(["train", "--config", str(config(folder, "reference"))])
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "reference"


def test_the_same_config_twice_gives_the_same_loss_bits(reference: Path) -> None:
    again = config(reference.parent, "again")
    result = halyard(["train", "--config", str(again)])
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = losses_by_step(reference), losses_by_step(reference.parent / "again")
    assert sorted(first) == list(range(1, STEPS + 1))
    assert first == second  # float equality of float32 values: the same bits


def test_kill9_after_a_checkpoint_resumes_to_the_uninterrupted_bits(reference: Path) -> None:
    killed = config(reference.parent, "killed")
    run_dir = reference.parent / "killed"
    log_path = reference.parent / "killed.log"
    with log_path.open("w") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", COMMAND, "train", "--config", str(killed)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=on_the_chip(),
        )
        deadline = time.monotonic() + 600
        while child.poll() is None and time.monotonic() < deadline:
            if max(scan_checkpoints(run_dir / "checkpoints", warn=False).complete, default=0) >= 4:
                break
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL, log_path.read_text()[-3000:]
    saved = latest_complete(run_dir / "checkpoints")
    assert saved is not None and 4 <= saved < STEPS, saved
    resumed = halyard(["train", "--config", str(killed)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert losses_by_step(run_dir) == losses_by_step(reference)


def test_the_commands_start_on_the_chip(reference: Path) -> None:
    commands = [
        ["generate", "--run", str(reference), "--prompt", "def ", "--max-new-tokens", "8"],
        ["eval", "--run", str(reference)],
        # step 7 recomputed from step 6's checkpoint: the logged loss's bits, or exit code 1
        ["replay", "--run", str(reference), "--step", str(STEPS - 1)],
    ]
    # One process (one start on the chip) runs the three, as the console script calls `main`.
    code = (
        "import sys; from halyard.train.cli import main\n"
        f"for argv in {commands!r}:\n"
        "    print('=== ' + argv[0], flush=True)\n"
        "    print('=== exit', main(argv), flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=on_the_chip()
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count("=== exit 0") == 3, result.stdout[-3000:] + result.stderr[-3000:]
    outputs = dict(
        part.split("\n", 1) for part in result.stdout.split("=== ")[1:] if not part.startswith("exit")
    )
    assert outputs["generate"].startswith("def ")
    assert '"eval_loss"' in outputs["eval"]
    assert f"step {STEPS - 1} of" in outputs["replay"]


def test_the_invariant_step_runs_twice_to_the_same_bits_on_the_chip(reference: Path) -> None:
    losses = []
    for name in ("invariant", "invariant-again"):
        path = config(reference.parent, name)
        result = halyard(
            ["train", "--config", str(path), "--trainer.invariant", "true", "--trainer.steps", "4"]
        )
        assert result.returncode == 0, result.stderr[-3000:]
        losses.append(losses_by_step(reference.parent / name))
    assert sorted(losses[0]) == [1, 2, 3, 4] and losses[0] == losses[1]
