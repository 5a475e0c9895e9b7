"""A 2-process run (gloo, 2 CPU devices each) trains and checkpoints; one process resumes it.

The data order is a function of the step alone, so the resumed single-process run continues the same
example stream and the whole loss trajectory equals an uninterrupted single-process run's.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import jax
import pytest
from trainer_fixtures import assert_trajectory_close, load_config, start_processes, write_config

from halyard.train.trainer.trainer import Trainer


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


@pytest.mark.multiprocess
def test_two_process_run_resumes_as_one_process(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    steps = 12  # the processes stop after about 5; one process trains the rest
    sections = {
        "trainer": {"steps": steps, "batch_size": 8, "mesh": {"data": 4}},
        "checkpoint": {"every_steps": 4},  # one periodic save on the 2 processes before their SIGTERM save
    }
    # The reference is read for its losses only: one checkpoint, at the end, instead of one every 2 steps.
    reference = write_config(
        tmp_path / "ref.yaml", tmp_path / "ref", cache, **sections | {"checkpoint": {"every_steps": steps}}
    )
    Trainer(load_config(reference), devices=jax.devices()[:4]).fit()  # in this process, on 4 of its devices

    # Two processes with 2 devices each train the same config until a SIGTERM (preemption) stops them.
    shared = write_config(tmp_path / "multi.yaml", tmp_path / "multi", cache, **sections)
    processes = start_processes(["--config", str(shared)])
    metrics = tmp_path / "multi" / "metrics.jsonl"
    outputs = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and all(p.poll() is None for p in processes):
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
                break
            time.sleep(0.1)
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            outputs.append(process.communicate(timeout=300))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 143, stderr[-3000:]

    # One process with 4 devices (this one, 4 of its 8) resumes the run to the end.
    resumed = Trainer(load_config(shared), devices=jax.devices()[:4]).fit()
    assert int(resumed.state.step) == steps
    expected, got = _losses(tmp_path / "ref"), _losses(tmp_path / "multi")
    assert sorted(got) == sorted(expected) == list(range(1, steps + 1))
    # gloo's all-reduce across the processes and one process's add the 4 devices' gradients in other orders
    assert_trajectory_close([got[s] for s in expected], [expected[s] for s in expected])
