"""The loader: background prefetching of this host's numpy batches, step after step."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np


class BatchSource(Protocol):
    """Anything with ``batch(step, batch_size, host_index, host_count)`` (``LMDataset``, ``MixtureDataset``)."""

    def batch(
        self, step: int, batch_size: int, host_index: int = 0, host_count: int = 1
    ) -> dict[str, np.ndarray]:
        """This host's rows of the batch of ``step``."""
        ...


class Loader:
    """Iterates this host's batches from ``start_step`` on, reading ``prefetch`` steps ahead in threads.

    Because a batch is a pure function of the step, resuming is ``Loader(..., start_step=saved_step)``:
    nothing about the loader needs to be checkpointed. ``loader.step`` is the step of the next batch.
    Use it as a context manager (or call ``close``) to stop the threads.
    """

    def __init__(
        self,
        dataset: BatchSource,
        batch_size: int,
        *,
        start_step: int = 0,
        stop_step: int | None = None,
        host_index: int = 0,
        host_count: int = 1,
        prefetch: int = 4,
        num_threads: int = 2,
    ) -> None:
        """Args:
        dataset: where batches come from.
        batch_size: the global batch size (this host gets ``batch_size // host_count`` rows).
        start_step: the first step to yield.
        stop_step: stop before this step (None: never stop).
        host_index: this host's index.
        host_count: the number of hosts.
        prefetch: batches prepared ahead of the consumer.
        num_threads: threads preparing batches.

        Raises:
            ValueError: ``prefetch`` or ``num_threads`` below 1, or ``batch_size`` not divisible by
                ``host_count``.
        """
        if prefetch < 1 or num_threads < 1:
            raise ValueError(f"prefetch and num_threads must be at least 1, got {prefetch} and {num_threads}")
        if batch_size % host_count:
            raise ValueError(f"batch_size={batch_size} is not divisible by host_count={host_count}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.host_index = host_index
        self.host_count = host_count
        self.step = start_step
        self.stop_step = stop_step
        self.prefetch = prefetch
        self._executor = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="halyard.data loader")
        self._pending: deque[tuple[int, Future[dict[str, np.ndarray]]]] = deque()
        self._next_to_submit = start_step

    def _fill(self) -> None:
        while len(self._pending) < self.prefetch and (
            self.stop_step is None or self._next_to_submit < self.stop_step
        ):
            step = self._next_to_submit
            future = self._executor.submit(
                self.dataset.batch, step, self.batch_size, self.host_index, self.host_count
            )
            self._pending.append((step, future))
            self._next_to_submit += 1

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        """The batch of ``self.step`` (then ``self.step`` advances)."""
        self._fill()
        if not self._pending:
            raise StopIteration
        step, future = self._pending.popleft()
        batch = future.result()
        self.step = step + 1
        self._fill()
        return batch

    def close(self) -> None:
        """Stop the prefetch threads (pending batches are dropped)."""
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
