"""Whether this process is one of several hosts a cluster manager started, read from the environment.

A TPU VM's environment always holds ``TPU_*`` variables, also on a single host: there
``TPU_WORKER_HOSTNAMES`` may name the one host, or hold no host name at all (a one-chip machine was seen
with a warning text in it). Only a list of two or more host names makes a multi-host TPU run; anything else
is one host, which needs no distributed runtime (JAX's own detection would ask the cloud metadata server,
which a sandboxed machine cannot reach, and stop the run before its first step).

``HALYARD_CLUSTER`` overrides the detection: ``none`` runs alone whatever the environment says; ``tpu``,
``slurm`` or ``ompi`` asks JAX to read that cluster's coordinates even where the variables above do not
name several hosts (e.g. a TPU pod whose hosts are known only to the metadata server).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

ENV_CLUSTER = "HALYARD_CLUSTER"
"""``auto`` (default: detect), ``none`` (one process), or a cluster to join: ``tpu``, ``slurm``, ``ompi``."""
CLUSTERS = ("tpu", "slurm", "ompi")
"""The cluster managers whose coordinates JAX reads (``jax.distributed.initialize()`` without arguments)."""

TPU_HOST_VARIABLES = ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES")
"""Where JAX reads a TPU slice's hosts from, first match wins (comma-separated host names or addresses)."""

_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]+)?")
"""A host name or IPv4 address (RFC 1123 labels), with an optional port."""

_SLURM = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


class ClusterNotFoundError(RuntimeError):
    """Joining a multi-host run was asked for (or detected), and its coordinator could not be found."""


def coordinates_hint() -> str:
    """What to set so that every host finds the run: the sentence the errors end with."""
    return (
        "set HALYARD_COORDINATOR=host:port (process 0's), HALYARD_NUM_PROCESSES=N and HALYARD_PROCESS_ID=i "
        "on every host (on a TPU pod: TPU_WORKER_HOSTNAMES=host0,host1,... and TPU_WORKER_ID=i), or "
        f"{ENV_CLUSTER}=none to run this host alone"
    )


def _tpu_host_variable(environ: Mapping[str, str]) -> str | None:
    """The variable JAX reads the TPU slice's hosts from, when one is set."""
    return next((variable for variable in TPU_HOST_VARIABLES if variable in environ), None)


def tpu_worker_hosts(environ: Mapping[str, str] | None = None) -> list[str]:
    """The TPU slice's hosts the environment names: ``[]`` when it names none, or holds anything else.

    Args:
        environ: the environment to read (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    variable = _tpu_host_variable(environ)
    if variable is None:
        return []
    hosts = [entry.strip() for entry in environ[variable].split(",")]
    return hosts if all(_HOST.fullmatch(host) for host in hosts) else []


def asked_cluster(environ: Mapping[str, str] | None = None) -> str | None:
    """``HALYARD_CLUSTER``: ``None`` for ``auto`` (or unset), else ``none`` or the cluster asked for.

    Args:
        environ: the environment to read (default ``os.environ``).

    Raises:
        ValueError: another value (names the variable and the values it takes).
    """
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_CLUSTER, "auto").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in ("none", *CLUSTERS):
        raise ValueError(
            f"{ENV_CLUSTER}={environ[ENV_CLUSTER]!r}: give auto (detect), none (run alone) or one of "
            f"{', '.join(CLUSTERS)}"
        )
    return value


def detect_cluster(environ: Mapping[str, str] | None = None) -> str | None:
    """The cluster manager that started this process as one of several, or ``None`` (run alone).

    ``HALYARD_CLUSTER`` decides when it is set to other than ``auto`` (``none`` gives ``None``). Otherwise:
    ``slurm`` when Slurm's task variables are set, ``ompi`` under Open MPI, ``tpu`` when
    ``TPU_PROCESS_ADDRESSES`` or ``TPU_WORKER_HOSTNAMES`` lists two or more host names (one, none, or a
    text that is not a list of host names: one host).

    Args:
        environ: the environment to inspect (default ``os.environ``).

    Raises:
        ValueError: ``HALYARD_CLUSTER`` holds an unknown value.
    """
    environ = os.environ if environ is None else environ
    asked = asked_cluster(environ)
    if asked is not None:
        return None if asked == "none" else asked
    if all(name in environ for name in _SLURM):
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in environ:
        return "ompi"
    if len(tpu_worker_hosts(environ)) > 1:
        return "tpu"
    return None


def why_cluster(cluster: str, environ: Mapping[str, str] | None = None) -> str:
    """What made `detect_cluster` answer ``cluster``: the variable, as a user would look it up.

    Args:
        cluster: what `detect_cluster` returned.
        environ: the environment it read (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    if asked_cluster(environ) is not None:
        return f"{ENV_CLUSTER}={environ[ENV_CLUSTER].strip()}"
    if cluster == "tpu":
        variable = _tpu_host_variable(environ)
        return f"{variable} names {len(tpu_worker_hosts(environ))} hosts"
    return "Slurm's SLURM_* variables" if cluster == "slurm" else "Open MPI's OMPI_MCA_orte_hnp_uri"


def check_tpu_hosts(environ: Mapping[str, str] | None = None) -> None:
    """Raise `ClusterNotFoundError` when the TPU hosts' variable is set but names no hosts to join.

    JAX would take such a text for the coordinator's host name and wait up to the initialization timeout
    for it to resolve; this says at once what to set instead.

    Args:
        environ: the environment to read (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    variable = _tpu_host_variable(environ)
    if variable is not None and not tpu_worker_hosts(environ):
        value = environ[variable]
        shown = value if len(value) <= 60 else value[:57] + "..."
        raise ClusterNotFoundError(
            f"{ENV_CLUSTER}=tpu asks to join a multi-host TPU run, but {variable}={shown!r} is not a "
            f"comma-separated list of host names; {coordinates_hint()}"
        )
