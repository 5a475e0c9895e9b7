"""Joining a multi-process run, and the small helpers every process needs (main process, barriers)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax
from jax.experimental import multihost_utils

from halyard.shard.cluster import (
    ClusterNotFoundError,
    check_tpu_hosts,
    coordinates_hint,
    detect_cluster,
    why_cluster,
)
from halyard.shard.console import filter_gloo_connection_lines

ENV_COORDINATOR = "HALYARD_COORDINATOR"
"""``host:port`` of process 0's coordinator service."""
ENV_NUM_PROCESSES = "HALYARD_NUM_PROCESSES"
ENV_PROCESS_ID = "HALYARD_PROCESS_ID"
ENV_HEARTBEAT_TIMEOUT = "HALYARD_HEARTBEAT_TIMEOUT_S"
"""Seconds without a heartbeat after which a process counts as dead (when ``initialize`` is not told)."""
DEFAULT_HEARTBEAT_TIMEOUT_S = 100


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in the run.

    Attributes:
        process_index: this process (0 is the main one).
        process_count: processes in the run.
        local_device_count: devices this process drives.
        device_count: devices in the whole run.
        joined_by: how the run was joined: ``"single"`` (no distributed runtime), ``"arguments"``,
            ``"environment"`` (HALYARD_* variables), ``"slurm"``, ``"ompi"``, ``"tpu"`` (JAX's detection)
            or ``"already"`` (jax.distributed was initialized before).
    """

    process_index: int
    process_count: int
    local_device_count: int
    device_count: int
    joined_by: str


def _int_from(value: int | str | None, what: str) -> int | None:
    if value is None or isinstance(value, int):
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {value!r}") from None


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: Sequence[int] | None = None,
    cpu_device_count: int | None = None,
    detect: bool = True,
    initialization_timeout_s: int = 300,
    heartbeat_timeout_s: int | None = None,
    environ: Mapping[str, str] | None = None,
    quiet_gloo: bool = True,
) -> ProcessInfo:
    """Join a multi-process run (``jax.distributed.initialize``), or run alone when there is none.

    Where the coordinates come from, first match wins: the arguments; the environment variables
    ``HALYARD_COORDINATOR`` (``host:port`` of process 0), ``HALYARD_NUM_PROCESSES``,
    ``HALYARD_PROCESS_ID``; JAX's own detection under Slurm, Open MPI or on a TPU pod (`detect_cluster`:
    a TPU host joins others only when ``TPU_WORKER_HOSTNAMES`` lists two or more hosts, or
    ``HALYARD_CLUSTER=tpu`` asks); otherwise a single process (nothing is initialized, nothing is asked of
    the network). CPU collectives are set to gloo first (unless already chosen),
    so a multi-process run works on one machine. Call it before anything else touches JAX devices.
    Calling it again once joined returns the same information.

    Args:
        coordinator_address: ``host:port`` where process 0 serves the coordinator (all agree on it).
        num_processes: processes in the run.
        process_id: this process, ``0 .. num_processes - 1``.
        local_device_ids: restrict this process to these local devices (e.g. one GPU per process).
        cpu_device_count: simulated CPU devices for this process (``jax_num_cpu_devices``; testing).
        detect: ask JAX to detect Slurm / Open MPI / TPU when no coordinates are given and `detect_cluster`
            finds the environment names several processes.
        initialization_timeout_s: give up when the other processes do not join within this time.
        heartbeat_timeout_s: a process silent this long is considered dead: the others then stop with an
            error naming it ("Task 1 heartbeat timeout") instead of waiting forever. Default:
            ``HALYARD_HEARTBEAT_TIMEOUT_S`` from the environment, else 100.
        environ: the environment to read (default ``os.environ``).
        quiet_gloo: with gloo's CPU collectives, keep its "Rank N is connected to M peer ranks" lines (one
            per rank and communicator) off stdout: the ``halyard.shard`` logger gets them at debug level
            (`halyard.shard.console`).

    Raises:
        ValueError: when only some of the three coordinates are given (names the missing ones and their
            environment variables), a variable is not an integer, or ``HALYARD_CLUSTER`` is unknown.
        ClusterNotFoundError: a cluster was detected or asked for (``HALYARD_CLUSTER``) and JAX found no
            coordinator in it; the one-line message says which variables to set.
        RuntimeError: from JAX when devices were already used before this call.
    """
    environ = os.environ if environ is None else environ
    if cpu_device_count is not None:
        jax.config.update("jax_num_cpu_devices", cpu_device_count)
    if jax.distributed.is_initialized():
        return process_info("already")
    given = coordinator_address, num_processes, process_id
    source = "arguments" if any(v is not None for v in given) else "environment"
    coordinator_address = coordinator_address or environ.get(ENV_COORDINATOR)
    num_processes = _int_from(
        num_processes if num_processes is not None else environ.get(ENV_NUM_PROCESSES), ENV_NUM_PROCESSES
    )
    process_id = _int_from(
        process_id if process_id is not None else environ.get(ENV_PROCESS_ID), ENV_PROCESS_ID
    )
    coordinates = {
        f"coordinator_address ({ENV_COORDINATOR})": coordinator_address,
        f"num_processes ({ENV_NUM_PROCESSES})": num_processes,
        f"process_id ({ENV_PROCESS_ID})": process_id,
    }
    missing = [name for name, value in coordinates.items() if value is None]
    if len(missing) == len(coordinates):
        cluster = detect_cluster(environ) if detect else None
        if cluster is None:
            return process_info("single")
        source = cluster
        if cluster == "tpu":
            check_tpu_hosts(environ)
    elif missing:
        raise ValueError(
            f"initialize: {', '.join(missing)} missing; give all three coordinates of the run (as "
            f"arguments or environment variables) or none of them"
        )
    if heartbeat_timeout_s is None:
        heartbeat_timeout_s = _int_from(environ.get(ENV_HEARTBEAT_TIMEOUT), ENV_HEARTBEAT_TIMEOUT)
    # Older JAX defaulted to no CPU collectives: multi-process CPU runs then fail at the first all-reduce.
    if getattr(jax.config, "jax_cpu_collectives_implementation", None) is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            local_device_ids=local_device_ids,
            initialization_timeout=initialization_timeout_s,
            heartbeat_timeout_seconds=heartbeat_timeout_s or DEFAULT_HEARTBEAT_TIMEOUT_S,
        )
    except (ValueError, RuntimeError, OSError) as error:
        # JAX's detection failing (no coordinator address, an unreachable metadata server, a host name
        # that does not resolve) ends in one of these; coordinates given explicitly keep JAX's own error, and
        # so does calling this after JAX's backend started (a bug in the caller, not in the environment).
        if source in ("arguments", "environment") or "must be called before" in str(error):
            raise
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ClusterNotFoundError(
            f"{why_cluster(source, environ)}, so this process joins a multi-process run, but JAX found no "
            f"coordinator ({type(error).__name__}: {reason[:200]}); {coordinates_hint()}"
        ) from error
    if quiet_gloo and getattr(jax.config, "jax_cpu_collectives_implementation", None) == "gloo":
        filter_gloo_connection_lines()
    return process_info(source)


def process_info(joined_by: str = "single") -> ProcessInfo:
    """This process's `ProcessInfo` (initializes JAX's backend if nothing has yet)."""
    return ProcessInfo(
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        local_device_count=jax.local_device_count(),
        device_count=jax.device_count(),
        joined_by=joined_by,
    )


def process_index() -> int:
    """This process's index (0 on a single machine)."""
    return jax.process_index()


def process_count() -> int:
    """Processes in the run (1 on a single machine)."""
    return jax.process_count()


def is_main_process() -> bool:
    """Whether this is process 0, the one that writes logs, checkpoints' metadata and reports."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier called ``name`` (a no-op with one process).

    Args:
        name: the same string on every process; distinct barriers need distinct names.
    """
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
