"""Two real processes on localhost (gloo, 2 simulated CPU devices each) share one 4-device mesh."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

WORKER = Path(__file__).with_name("two_process_worker.py")
NUM_PROCESSES = 2
# A hang guard only, as long as the other multi-process tests': two processes importing jax and compiling on a
# loaded 2-core machine (a CPU hog beside three test workers) get a fraction of a core each.
TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run_workers(tmp_path: Path, worker: Path = WORKER) -> list[dict]:
    """Start the workers, wait for all (killing everyone when one fails or time runs out), parse reports."""
    port = _free_port()
    processes, logs = [], []
    for process_id in range(NUM_PROCESSES):
        env = {
            **os.environ,
            "XLA_FLAGS": f"--xla_force_host_platform_device_count=2 {os.environ.get('HALYARD_TEST_XLA_COMPILE_FLAGS', '')}",
            "JAX_PLATFORMS": "cpu",
            "HALYARD_COORDINATOR": f"127.0.0.1:{port}",
            "HALYARD_NUM_PROCESSES": str(NUM_PROCESSES),
            "HALYARD_PROCESS_ID": str(process_id),
        }
        log = tmp_path / f"process{process_id}.log"
        logs.append(log)
        with log.open("w") as out:
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(worker)],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            codes = [p.poll() for p in processes]
            if all(code == 0 for code in codes) or any(code not in (None, 0) for code in codes):
                break
            time.sleep(0.2)
    finally:
        for p in processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # the session we started for this worker
                p.wait()
    codes = [p.returncode for p in processes]
    texts = [log.read_text() for log in logs]
    if codes != [0] * NUM_PROCESSES:
        tails = "\n".join(
            f"--- process {i} (exit {c}) ---\n{t[-3000:]}" for i, (c, t) in enumerate(zip(codes, texts))
        )
        pytest.fail(f"two-process run failed or timed out after {TIMEOUT_S} s:\n{tails}")
    return [
        json.loads(next(line for line in t.splitlines() if line.startswith("RESULT "))[7:]) for t in texts
    ]


def _numpy_reference(w_in: np.ndarray, w_out: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Loss, gradient norm and row sums of the worker's model on the whole batch, in float64."""
    rows = np.arange(8, dtype=np.float64)[:, None] + 0.01 * np.arange(8, dtype=np.float64)[None, :]
    hidden = np.tanh(rows @ w_in)
    out = hidden @ w_out
    loss = np.mean(out**2)
    d_out = 2 * out / out.size
    grad_w_out = hidden.T @ d_out
    grad_w_in = rows.T @ ((d_out @ w_out.T) * (1 - hidden**2))
    return loss, float(np.sqrt(np.sum(grad_w_in**2) + np.sum(grad_w_out**2))), rows.sum(axis=1)


@pytest.mark.multiprocess
def test_two_processes_build_one_mesh_and_agree(tmp_path: Path) -> None:
    first, second = _run_workers(tmp_path)
    for index, report in enumerate((first, second)):
        assert report["process_index"] == index
        assert (report["process_count"], report["local_device_count"], report["device_count"]) == (2, 2, 4)
        assert report["joined_by"] == "environment"
        assert report["is_main"] == (index == 0)
        assert report["mesh_shape"]["data"] == 4
        assert report["mesh_processes"] == [0, 0, 1, 1]  # batch axes walk across processes slowest
        assert report["hybrid_processes"] == [[0, 0], [1, 1]]  # dcn_data=2: data splits across processes
        assert report["batch_shape"] == [8, 8]
    # each process holds a contiguous block of the global batch: rows 0-3 and rows 4-7
    assert first["local_batch_rows"] == [0, 2] and second["local_batch_rows"] == [4, 6]
    for key in ("loss", "grad_norm", "w_in", "w_out", "row_sums"):
        assert first[key] == second[key], key
    loss, grad_norm, row_sums = _numpy_reference(np.array(first["w_in"]), np.array(first["w_out"]))
    # float32 against float64: the rows' rounding, the two products (8 and 16 terms), tanh, the square and
    # the mean over 8 x 8 outputs; the gradient norm adds the backward pass, the batch's 8 rows and its 256
    # squares with the square root
    loss_terms = 1 + 8 + 16 + FUNCTION_TERMS + 1 + 64
    np.testing.assert_allclose(first["loss"], loss, atol=summation_tolerance(loss, loss_terms), rtol=0)
    norm_bound = summation_tolerance(grad_norm, 2 * loss_terms + 8 + 256 + FUNCTION_TERMS)
    np.testing.assert_allclose(first["grad_norm"], grad_norm, atol=norm_bound, rtol=0)
    np.testing.assert_allclose(first["row_sums"], row_sums, atol=summation_tolerance(row_sums, 1 + 8), rtol=0)
    # gloo's "Rank N is connected to M peer ranks" lines (one per rank and communicator) stay off the
    # console; the worker's own lines all arrive.
    for process_id in range(NUM_PROCESSES):
        log = (tmp_path / f"process{process_id}.log").read_text()
        assert "[Gloo]" not in log and "peer ranks" not in log, log[-3000:]


@pytest.mark.multiprocess
def test_a_failing_process_stops_the_others_at_once(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import os, sys, time\n"
        "if os.environ['HALYARD_PROCESS_ID'] == '1':\n"
        "    sys.exit('process 1 gives up')\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    with pytest.raises(
        pytest.fail.Exception, match=r"(?s)process 0 \(exit -9\).*process 1 \(exit 1\).*gives up"
    ):
        _run_workers(tmp_path, worker)
    assert time.monotonic() - started < 300  # far below the 600 s sleep; room for a loaded machine
