"""The Ray builder: one Ray task per shard, on an existing cluster or a local Ray started on request."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from halyard.data.builders.shard_worker import ShardJob, build_shard
from halyard.data.errors import DataInputError
from halyard.data.processing.processor import Processor


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
        the first exception a shard task raised.
    """
    ray = _import_ray()
    if not ray.is_initialized():
        if ray_address is not None:
            ray.init(address=ray_address)
        else:
            ray.init(num_cpus=num_workers, include_dashboard=False, log_to_driver=False)
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
