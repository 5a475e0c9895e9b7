"""The Ray builder: one Ray task per shard, on an existing cluster or a local Ray started on request."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from halyard.data.builders.shard_worker import ShardJob, build_shard
from halyard.data.errors import DataInputError, RayStartError
from halyard.data.processing.processor import Processor

LOCAL_RAY_START_SECONDS = 300.0
"""How long a local Ray may take to start. Ray itself waits a fixed 30 s for the new node to register with
its GCS (``ray/_private/node.py``), which a loaded machine misses: the node's agents are Python processes
that start slowly there."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "builder='ray' needs Ray: pip install 'halyard-data-cache[ray]' (or use the default local builder)"
        ) from error
    return ray


def _build_shard_task(job: ShardJob, processor: Processor) -> int:
    # One tokenizer thread per task (each task holds one CPU); read when the tokenizer is first used here.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    build_shard(job, processor)
    return job.shard_index


def run_ray(
    jobs: list[ShardJob],
    processor: Processor,
    *,
    ray_address: str | None,
    num_workers: int | None,
    poll: Callable[[], None],
    poll_seconds: float,
) -> None:
    """Build ``jobs`` as Ray tasks (one CPU each) and wait for all of them.

    The cache folder must be reachable from every Ray node under the same URL (shared disk or an object
    store). Writes and chunk boundaries are those of ``build_shard``, so the bytes equal the local builder's.

    Args:
        jobs: the unfinished shards.
        processor: the tokenizer and policy (put once in Ray's object store).
        ray_address: the cluster to join (``"auto"`` or ``"ray://host:10001"``); None starts a local Ray
            with ``num_workers`` CPUs unless Ray is already initialized in this process.
        num_workers: CPUs of the local Ray (default: all) and the most tasks in flight.
        poll: called every ``poll_seconds`` while waiting.
        poll_seconds: see ``poll``.

    Raises:
        ImportError: Ray is not installed (names the extra to install).
        RayStartError: a local Ray did not start in `LOCAL_RAY_START_SECONDS`.
        the first exception a shard task raised.
    """
    ray = _import_ray()
    if not ray.is_initialized():
        if ray_address is not None:
            ray.init(address=ray_address)
        else:
            start_local_ray(num_workers)
    remote = ray.remote(num_cpus=1, max_retries=0)(_build_shard_task)
    processor_ref = ray.put(processor)
    in_flight_limit = num_workers or int(ray.cluster_resources().get("CPU", 1))
    waiting = list(jobs)
    running: list[Any] = []
    try:
        while waiting or running:
            while waiting and len(running) < in_flight_limit:
                running.append(remote.remote(waiting.pop(0), processor_ref))
            done, running = ray.wait(running, num_returns=1, timeout=poll_seconds)
            for reference in done:
                try:
                    ray.get(reference)
                except ray.exceptions.RayTaskError as error:
                    # Ray's wrapper prints the task's traceback in its message; bad input keeps its own.
                    if isinstance(error.cause, DataInputError):
                        raise error.cause from None
                    raise
            poll()
    except BaseException:
        for reference in running:
            ray.cancel(reference, force=True)
        raise


def start_local_ray(num_cpus: int | None, **options: Any) -> None:
    """``ray.init`` a local Ray of ``num_cpus`` CPUs (None: all), waiting up to `LOCAL_RAY_START_SECONDS`
    for its node to register instead of Ray's own 30 s.

    Args:
        num_cpus: CPUs the local Ray offers.
        options: more ``ray.init`` keywords (they override the defaults: no dashboard, no worker logs).

    Raises:
        ImportError: Ray is not installed.
        RayStartError: the local Ray did not start (its reason, and what to do instead).
    """
    ray = _import_ray()
    started = time.monotonic()
    try:
        with _patient_node_registration(ray, LOCAL_RAY_START_SECONDS):
            ray.init(**{"num_cpus": num_cpus, "include_dashboard": False, "log_to_driver": False, **options})
    except Exception as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise RayStartError(
            f"a local Ray did not start (after {time.monotonic() - started:.0f} s: {reason}); build without "
            "Ray (the local builder), or start Ray yourself (`ray start --head`) and give its address "
            "(ray_address=auto)"
        ) from error


@contextlib.contextmanager
def _patient_node_registration(ray: Any, seconds: float) -> Iterator[None]:
    """While active, each look-up of a node that Ray's start makes waits up to ``seconds`` for the node to
    register, so Ray's fixed 30 s wait around it does not end first. A Ray without that function (another
    version) is left as it is."""
    services: Any = getattr(getattr(ray, "_private", None), "services", None)
    get_node = getattr(services, "get_node", None)
    if get_node is None:
        yield
        return

    def patient_get_node(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + seconds
        while True:
            try:
                return get_node(*args, **kwargs)
            except RuntimeError:  # "not found": the node has not registered yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = patient_get_node
    try:
        yield
    finally:
        services.get_node = get_node
