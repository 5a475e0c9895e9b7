"""Enough threads in XLA's CPU runtime for the collectives of simulated CPU devices.

XLA's CPU client runs every device's share of a program on one thread pool of ``max(cores, devices)``
threads, and an in-process collective holds its thread until every device of its group has joined. A program
with independent collectives (tensor parallelism's all-reduces inside the layer loop beside an all-gather over
the data axis) may start them in a different order on different devices: once all the pool's threads wait in
collectives, the device tasks that would complete them wait for a thread, and XLA ends the process 40 s later
("Termination timeout for `all gather RendezvousKey...` exceeded"). With 8 simulated devices on a 2-core
machine (a pool of 8 threads) this ended a tensor-parallel training run in about one run of four.

`reserve_collective_threads` sizes that pool at `THREADS_PER_DEVICE` threads per simulated device through
``PJRT_NPROC``, the variable XLA's CPU client reads when it starts. ``import halyard.shard`` calls it, so a
process that imports Halyard before it first touches a device gets the larger pool.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

THREADS_PER_DEVICE = 4
"""Pool threads per simulated CPU device: room for several collectives started at once on every device."""
POOL_SIZE_VARIABLES = ("PJRT_NPROC", "NPROC")
"""Variables XLA's CPU client reads for its thread pool's size (the first one set wins)."""
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def simulated_cpu_devices(environ: MutableMapping[str, str] | None = None) -> int:
    """How many CPU devices ``environ`` asks XLA to simulate (``XLA_FLAGS``' device count, or
    ``JAX_NUM_CPU_DEVICES``); 1 when neither asks for more."""
    environ = os.environ if environ is None else environ
    counts = [int(match) for match in _DEVICE_COUNT_FLAG.findall(environ.get("XLA_FLAGS", ""))]
    if environ.get("JAX_NUM_CPU_DEVICES", "").strip().isdigit():
        counts.append(int(environ["JAX_NUM_CPU_DEVICES"]))
    return max([1, *counts])


def reserve_collective_threads(environ: MutableMapping[str, str] | None = None) -> int | None:
    """Set ``PJRT_NPROC`` to `THREADS_PER_DEVICE` threads per simulated CPU device, unless a pool size is set
    already or only one device is simulated. It takes effect only if jax has not started its CPU backend yet.

    Args:
        environ: the environment to read and change (default: this process's, which child processes inherit).

    Returns:
        The pool size set, or None when nothing was changed.
    """
    environ = os.environ if environ is None else environ
    devices = simulated_cpu_devices(environ)
    if devices <= 1 or any(environ.get(name) for name in POOL_SIZE_VARIABLES):
        return None
    threads = max(THREADS_PER_DEVICE * devices, os.cpu_count() or 1)
    environ["PJRT_NPROC"] = str(threads)
    return threads
