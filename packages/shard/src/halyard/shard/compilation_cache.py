"""JAX's persistent compilation cache: compiled programs are kept on disk, so a process that starts again
(a training run resumed after preemption or kill -9, the next run of the same shapes, a server started
again) loads its programs instead of compiling them.

Training's ``trainer.compilation_cache`` (default ``~/.cache/halyard/jax``; null: no cache) and serving's
``EngineConfig.compilation_cache`` (``--compilation-cache``) name the folder. A folder set already, by
``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``, is kept. Programs that compile in less than
``jax_persistent_cache_min_compile_time_secs`` (JAX's default: 1 s) are not stored.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
_HITS = "/jax/compilation_cache/cache_hits"


class _Counts:
    """How many compiles asked the cache, and how many it answered, since this process started."""

    def __init__(self) -> None:
        self.requests = 0
        self.hits = 0
        self._lock = threading.Lock()
        jax.monitoring.register_event_listener(self._record)

    def _record(self, event: str, **_: Any) -> None:
        if event in (_REQUESTS, _HITS):
            with self._lock:
                if event == _REQUESTS:
                    self.requests += 1
                else:
                    self.hits += 1


_COUNTS: _Counts | None = None


def use_compilation_cache(directory: str | None) -> str | None:
    """Make JAX keep compiled programs in ``directory``, unless a cache folder is set already.

    Args:
        directory: the folder (``~`` expands; a ``gs://`` URL works too); None or "": no cache.

    Returns:
        The folder in use (the one set before, else ``directory``), or None when there is no cache.
    """
    global _COUNTS
    current = cache_directory()
    if not current and directory:
        current = os.path.expanduser(directory) if "://" not in directory else directory
        compilation_cache.set_cache_dir(current)
        compilation_cache.reset_cache()  # a compile before this one decided "no cache"; decide again
    if current and _COUNTS is None:
        _COUNTS = _Counts()
    return current or None


def cache_directory() -> str | None:
    """The persistent compilation cache's folder in this process, or None."""
    return getattr(jax.config, "jax_compilation_cache_dir", None) or None  # a flag mypy does not know


def cache_counts() -> tuple[int, int]:
    """(compiles that asked the persistent cache, how many of them it answered) in this process so far."""
    return (_COUNTS.requests, _COUNTS.hits) if _COUNTS is not None else (0, 0)
