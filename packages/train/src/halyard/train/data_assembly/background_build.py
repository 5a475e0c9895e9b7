"""The token cache built while the run trains: every host tokenizes its share of the shards (or a Ray cluster
does), training starts as soon as its first batches exist, and a step that catches up with the build waits.

What a batch holds never depends on how far the build got (``data.shuffle`` era or none; feistel waits for
the whole cache, and says so), so a run started on a partial cache and resumed on the finished one has the same bits as
a run started on the finished cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from halyard.data import BuildHandle, DataInputError, TokenCache
from halyard.shard import is_main_process
from halyard.train.config.errors import ConfigError


def when_training_starts(shuffle: str, era_windows: int) -> str:
    """When the first step of a run whose cache is still being built can start, for ``data.shuffle``."""
    if shuffle == "feistel":
        return (
            "the first step waits for the whole cache (data.shuffle=feistel permutes all of it; "
            "data.shuffle=era starts on the first era)"
        )
    if shuffle == "era":
        return (
            f"training starts once its first era ({era_windows:,} sequences, data.era_windows) is tokenized"
        )
    return "training starts as soon as its first batches are tokenized"


@dataclass
class BackgroundBuild:
    """This process's view of the cache build that runs beside training.

    Attributes:
        cache: the cache, readable while it is built (reads wait for tokens not written yet).
        handle: this process's build (None where this process does not build: ``data.builder=ray`` on a
            process other than 0).
        in_config_terms: turns a data error into the one-line error naming the run config's key.
        clock: a monotonic seconds counter.
        first_step: when the first step can start, in words (`when_training_starts`).
    """

    cache: TokenCache
    handle: BuildHandle | None
    in_config_terms: Callable[[DataInputError], ConfigError]
    clock: Callable[[], float] = time.monotonic
    first_step: str = "training starts as soon as its first batches are tokenized"
    _started: float = field(init=False)
    _tokens_at_start: int = field(init=False)
    _reported_finished: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._started = self.clock()
        status = self.cache.build_status()
        self._tokens_at_start = status.tokens
        self._reported_finished = status.finished
        if self.handle is not None and not status.finished:
            shards = self.handle.shards
            print(
                f"data: building the token cache in the background ({len(shards)} of {status.shards} shards "
                f"on this process); {self.first_step}",
                flush=True,
            )

    def metrics(self) -> dict[str, float]:
        """The build's progress for the trackers: ``data/build_*`` (documents, tokens, shards, tokens/s)."""
        self.cache.refresh()
        status = self.cache.build_status()
        values = status.metrics()
        if not self._reported_finished or not status.finished:
            elapsed = max(self.clock() - self._started, 1e-9)
            values["data/build_tokens_per_second"] = (status.tokens - self._tokens_at_start) / elapsed
        if status.finished and not self._reported_finished:
            self._reported_finished = True
            if is_main_process():
                print(
                    f"data: the token cache is built: {status.tokens:,} tokens, {status.documents:,} documents, "
                    f"{status.shards} shards ({values['data/build_tokens_per_second']:,.0f} tokens/s)",
                    flush=True,
                )
        return values

    def next_batch(self, batches: Iterator[dict[str, np.ndarray]], log: Any) -> dict[str, np.ndarray]:
        """The loader's next batch; time blocked on it is counted as waiting for data (``log.data_wait_timer``).

        Raises:
            ConfigError: the build failed on a bad source or record (names the run config's key).
        """
        self.raise_build_error()
        try:
            with log.data_wait_timer():
                return next(batches)
        except DataInputError as error:
            raise self.in_config_terms(error) from error

    def raise_build_error(self) -> None:
        """Raise the first error of this process's build, if it failed (a data error in config terms)."""
        if self.handle is not None and self.handle.errors:
            self._raise(self.handle.errors[0])

    def _raise(self, error: BaseException) -> None:
        if isinstance(error, DataInputError):
            raise self.in_config_terms(error) from error
        raise error

    def close(self) -> None:
        """Stop this process's build if training ended first (what it wrote stays; the next run resumes it)."""
        if self.handle is None or self.handle.done():
            return
        self.handle.stop(timeout=60)
        status = self.cache.build_status()
        print(
            f"data: training ended before the cache build: stopped it at {status.shards_finished}/"
            f"{status.shards} shards ({status.tokens:,} tokens); the next run resumes it",
            flush=True,
        )
