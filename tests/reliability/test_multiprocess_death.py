"""A 2-process training run where one process is killed: the survivor stops, naming the dead process.

Without a bound, a collective waiting for a dead peer can hang a job until its wall-clock limit. The
coordination service's heartbeat (``HALYARD_HEARTBEAT_TIMEOUT_S``, read by `halyard.shard.initialize`)
declares the silent process dead and stops the survivor with an error that names it.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from reliability_helpers import kill_hard, output, start_training, wait_until
from trainer_fixtures import write_config

HEARTBEAT_TIMEOUT_S = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.multiprocess
def test_a_dead_peer_stops_the_survivor_with_a_message_naming_it(tmp_path: Path, shared_cache: Path) -> None:
    config = write_config(
        tmp_path / "multi.yaml",
        tmp_path / "multi",
        shared_cache,
        trainer={"steps": 100_000, "mesh": {"data": 2}},
        checkpoint={"every_steps": None},
    )
    port = free_port()
    children, logs = [], []
    for process_id in range(2):
        logs.append(tmp_path / f"process{process_id}.log")
        children.append(
            start_training(
                config,
                logs[-1],
                devices=1,
                env={
                    "HALYARD_COORDINATOR": f"127.0.0.1:{port}",
                    "HALYARD_NUM_PROCESSES": "2",
                    "HALYARD_PROCESS_ID": str(process_id),
                    "HALYARD_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
                },
            )
        )
    survivor, victim = children
    try:
        metrics = tmp_path / "multi" / "metrics.jsonl"
        assert wait_until(metrics.exists, survivor, timeout=400), output(logs[0])[-3000:]
        assert kill_hard(victim) == -signal.SIGKILL
        try:
            status = survivor.wait(timeout=HEARTBEAT_TIMEOUT_S + 300)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the survivor still runs {HEARTBEAT_TIMEOUT_S + 300} s after its peer died")
    finally:
        for child in children:
            kill_hard(child)
    assert status != 0
    text = output(logs[0])
    # JAX's coordination service names the silent process: "tasks are unhealthy (stopped sending
    # heartbeats):\n1" (or "Task 1 heartbeat timeout", depending on which side notices first).
    assert re.search(r"stopped sending heartbeats\):\s*1\b|Task 1 heartbeat timeout", text), text[-3000:]
