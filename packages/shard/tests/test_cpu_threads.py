"""halyard.shard.cpu_threads: simulated CPU devices get a thread pool of 4 threads per device, so that programs
with independent collectives cannot wait on each other for a thread."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from halyard.shard import reserve_collective_threads, simulated_cpu_devices
from halyard.shard.cpu_threads import THREADS_PER_DEVICE

COUNT_POOL_THREADS = """
import os, jax, halyard.shard
jax.devices()
task = f"/proc/{os.getpid()}/task"
print(sum(open(f"{task}/{t}/comm").read().strip() == "tf_XLAEigen" for t in os.listdir(task)))
"""


@pytest.mark.parametrize(
    ("environ", "devices"),
    [
        ({}, 1),
        ({"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}, 1),
        ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_dump_to=x"}, 8),
        ({"JAX_NUM_CPU_DEVICES": "4"}, 4),
        ({"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_NUM_CPU_DEVICES": "16"}, 16),
    ],
)
def test_simulated_device_count_is_read_from_the_environment(environ: dict[str, str], devices: int) -> None:
    assert simulated_cpu_devices(environ) == devices


def test_the_pool_is_sized_per_device_unless_one_device_or_a_size_is_given() -> None:
    environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert reserve_collective_threads(environ) == max(THREADS_PER_DEVICE * 8, os.cpu_count() or 1)
    assert environ["PJRT_NPROC"] == str(max(THREADS_PER_DEVICE * 8, os.cpu_count() or 1))
    for chosen in ({"PJRT_NPROC": "12"}, {"NPROC": "12"}):
        kept = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", **chosen}
        assert reserve_collective_threads(kept) is None
        assert kept == {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", **chosen}
    single: dict[str, str] = {}
    assert reserve_collective_threads(single) is None and single == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads by name in /proc")
def test_importing_halyard_shard_gives_xla_its_threads() -> None:
    """Through the public surface: a process that imports halyard.shard before touching a device runs XLA's
    CPU client with 4 threads per device (XLA's own default: one per device on a machine of fewer cores)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC")}
    environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    environ["JAX_PLATFORMS"] = "cpu"

    def pool_threads(extra: dict[str, str]) -> int:
        run = subprocess.run(
            [sys.executable, "-c", COUNT_POOL_THREADS],
            env={**environ, **extra},
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        return int(run.stdout.split()[-1])

    assert pool_threads({}) == max(THREADS_PER_DEVICE * 8, os.cpu_count() or 1)
    assert pool_threads({"PJRT_NPROC": "8"}) == 8  # a size the user gives is kept
