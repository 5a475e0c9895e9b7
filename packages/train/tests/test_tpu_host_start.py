"""The commands start on a single TPU host, whose environment holds ``TPU_*`` variables (issue 51).

On a one-chip TPU v5e machine ``TPU_WORKER_HOSTNAMES`` held a warning text instead of host names (on
another day ``localhost``), and ``train`` stopped before step 1 asking the unreachable metadata server for the pod's coordinator. Here, on
CPU, with those variables set: ``train`` resumes a tiny run alone (one host name, or the warning text),
``halyard generate|eval|replay|plan|serve`` start on it, and two host names make ``train`` look for the
pod's coordinator, which it cannot find here, so it says in one line which variables to set.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halyard.train.trackers.jsonl import read_jsonl

FIXTURE = Path(__file__).parent / "fixtures" / "run-0.3.0"  # the demo at a tiny size, step-4 checkpoint
ONE_HOST = "localhost"  # what the one-chip v5e machine held on 2026-12-05
JUNK = "WARNING: could not determine TPU worker hostnames or IP addresses"  # a text, not host names
TWO_HOSTS = "t1v-n-5e0c1a2b-w-0,t1v-n-5e0c1a2b-w-1"
COMMAND = "import sys; from halyard.train.cli import main; sys.exit(main(sys.argv[1:]))"


def tpu_environment(hostnames: str, **more: str) -> dict[str, str]:
    """This environment as a TPU host's (one CPU device stands in for its chip)."""
    flags = os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", "")
    return dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {flags}",
        JAX_PLATFORMS="cpu",
        TPU_WORKER_HOSTNAMES=hostnames,
        TPU_WORKER_ID="0",
        TPU_ACCELERATOR_TYPE="v5litepod-4",
        TPU_SKIP_MDS_QUERY="true",
        **more,
    )


def halyard(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``halyard ARGS`` in a fresh process with ``env``."""
    return subprocess.run(
        [sys.executable, "-c", COMMAND, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def resume_to(run: Path, steps: int) -> list[str]:
    """``halyard train`` arguments that continue the run folder ``run`` to ``steps`` steps."""
    return [
        "train",
        "--config",
        str(run / "config.yaml"),
        "--trainer.run_dir",
        str(run),
        "--trainer.steps",
        str(steps),
        "--checkpoint.keep_last",
        "3",
    ]


@pytest.fixture(scope="module")
def tpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture run, trained on by `train` with a one-chip machine's warning text, then one host name."""
    run = tmp_path_factory.mktemp("tpu-host") / "run"
    shutil.copytree(FIXTURE, run)
    for hostnames, steps in ((JUNK, 5), (ONE_HOST, 6)):
        result = halyard(resume_to(run, steps), tpu_environment(hostnames))
        assert result.returncode == 0, f"TPU_WORKER_HOSTNAMES={hostnames!r}:\n{result.stderr[-3000:]}"
    return run


def test_train_runs_alone_on_one_tpu_host(tpu_run: Path) -> None:
    steps = [record["step"] for record in read_jsonl(tpu_run / "metrics.jsonl") if "loss" in record]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert (tpu_run / "checkpoints" / "step_00000006").is_dir()


def test_two_tpu_hosts_without_a_coordinator_say_what_to_set(tpu_run: Path) -> None:
    result = halyard(resume_to(tpu_run, 7), tpu_environment(TWO_HOSTS))
    assert result.returncode == 2, result.stderr[-3000:]
    error = result.stderr.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    assert error.startswith("error: TPU_WORKER_HOSTNAMES names 2 hosts, so this process joins"), error
    assert "HALYARD_COORDINATOR=host:port" in error and "HALYARD_CLUSTER=none" in error
    # asked for where the variable names no hosts: the same one line, at once
    asked = halyard(resume_to(tpu_run, 7), tpu_environment(JUNK, HALYARD_CLUSTER="tpu"))
    assert asked.returncode == 2 and asked.stderr.startswith("error: HALYARD_CLUSTER=tpu asks"), asked.stderr
    assert len(asked.stderr.strip().splitlines()) == 1
    assert not (tpu_run / "checkpoints" / "step_00000007").exists()


def test_the_other_commands_start_on_a_tpu_host(tpu_run: Path, tmp_path: Path) -> None:
    commands = [
        ["generate", "--run", str(tpu_run), "--prompt", "def ", "--max-new-tokens", "4"],
        ["eval", "--run", str(tpu_run)],
        ["replay", "--run", str(tpu_run), "--step", "6"],  # from step 5's checkpoint, the logged loss's bits
        ["plan", "--config", str(tpu_run / "config.yaml"), "--devices", "1"],
    ]
    # One process runs the four (each one's own process costs seconds of imports): `main` as the console
    # script calls it, each command's output after a line naming it.
    code = (
        "import sys; from halyard.train.cli import main\n"
        f"for argv in {commands!r}:\n"
        "    print('=== ' + argv[0], flush=True)\n"
        "    code = main(argv)\n"
        "    print('=== exit', code, flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=tpu_environment(JUNK)
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    outputs = dict(
        part.split("\n", 1) for part in result.stdout.split("=== ")[1:] if not part.startswith("exit")
    )
    assert result.stdout.count("=== exit 0") == 4, result.stdout[-3000:] + result.stderr[-3000:]
    assert outputs["generate"].startswith("def ")
    assert '"eval_loss"' in outputs["eval"]
    assert "step 6 of" in outputs["replay"]
    assert "step time" in outputs["plan"]
    # serve: up and listening, then SIGTERM ends it with code 0
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-c", COMMAND, "serve", "--run", str(tpu_run), "--port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=tpu_environment(ONE_HOST),
        )
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and server.poll() is None:
                if "Uvicorn running on" in log_path.read_text():
                    break
                time.sleep(0.5)
            assert server.poll() is None, log_path.read_text()[-3000:]
            assert "Uvicorn running on" in log_path.read_text(), log_path.read_text()[-3000:]
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=60) == 0, log_path.read_text()[-3000:]
        finally:
            if server.poll() is None:
                server.kill()
