"""Two JAX processes (gloo on CPU) save one checkpoint together; one process restores it on other meshes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from halyard.train.checkpoint.checksums import file_checksum
from halyard.train.checkpoint.commit_marker import read_commit_marker
from halyard.train.checkpoint.discovery import latest_complete
from halyard.train.checkpoint.restore import restore

pytestmark = pytest.mark.multiprocess

WEIGHTS = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)

CHILD = """
import sys
import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
port, process_id, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.preemption import PreemptionFlag
from halyard.train.checkpoint.policies import SavePolicy

mesh = jax.make_mesh((8,), ("fsdp",))
by_rows = NamedSharding(mesh, P("fsdp"))
weights = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
w = jax.make_array_from_callback(weights.shape, by_rows, lambda index: weights[index])

# Only process 0's clock has moved past the time-based interval; its decision is everyone's.
now = [0.0]
manager = CheckpointManager(root, save_policy=SavePolicy(every_seconds=10), clock=lambda: now[0])
now[0] = 50.0 if process_id == 0 else 0.0
assert manager.should_save(3)
assert manager.save(3, {"w": w, "step": 3}, {"data": {"seed": 1}}, wait=True)

# Every process restores its own slices onto the same 2-process mesh.
target = {"w": jax.ShapeDtypeStruct(weights.shape, np.float32, sharding=by_rows), "step": 0}
restored = manager.restore(None, target).state
for shard in restored["w"].addressable_shards:
    assert np.array_equal(np.asarray(shard.data), weights[shard.index])
assert restored["step"] == 3

# A SIGTERM seen by process 1 only stops both.
flag = PreemptionFlag()
if process_id == 1:
    flag.set()
assert flag.requested_on_any_process()
manager.close()
print("ok", flush=True)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def test_two_processes_save_and_one_process_restores(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    root = tmp_path / "checkpoints"
    port = str(free_port())
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count=4 {os.environ.get('HALYARD_TEST_XLA_COMPILE_FLAGS', '')}",
    }
    children = [
        subprocess.Popen(
            [sys.executable, str(script), port, str(process_id), str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for process_id in (0, 1)
    ]
    outputs = []
    try:
        for child in children:
            # a hang guard only, as long as the other multi-process tests' (room for a loaded machine)
            outputs.append(child.communicate(timeout=600)[0])
    finally:
        for child in children:
            child.kill()
    for child, output in zip(children, outputs):
        assert child.returncode == 0 and "ok" in output.splitlines(), output[-4000:]

    assert latest_complete(root) == 3
    marker = read_commit_marker(root / "step_00000003")
    assert marker.process_count == 2
    # Process 0 checksummed every file after both processes finished, those process 1 wrote included.
    assert set(marker.checksums) == set(marker.files)
    assert any("process_1" in name for name in marker.files), sorted(marker.files)
    for name, recorded in marker.checksums.items():
        assert file_checksum(root / "step_00000003" / name) == recorded, name
    one_device = SingleDeviceSharding(jax.devices()[0])
    target = {"w": jax.ShapeDtypeStruct(WEIGHTS.shape, np.float32, sharding=one_device), "step": 0}
    restored = restore(root / "step_00000003", target, expected_data={"seed": 1})
    assert np.array_equal(np.asarray(restored.state["w"]), WEIGHTS)
    if jax.device_count() >= 8:  # the same checkpoint onto this process's 8 devices, by columns
        columns = NamedSharding(jax.make_mesh((2, 4), ("data", "tensor")), P(None, "tensor"))
        restored = restore(
            root / "step_00000003", {"w": jax.ShapeDtypeStruct(WEIGHTS.shape, np.float32), "step": 0}, columns
        )
        assert np.array_equal(np.asarray(restored.state["w"]), WEIGHTS)
        assert restored.state["w"].sharding == columns
