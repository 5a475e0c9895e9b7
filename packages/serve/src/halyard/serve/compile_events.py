"""How many XLA compiles the calling thread has run, and how many programs it read from JAX's persistent
compilation cache instead: a program jitted on first call (the engine's store program) compiles inside the
call, finds the program compiled already (by this engine or another engine of the process), or reads it
from the cache's folder; the counts around the call tell which, whatever else other threads compile
meanwhile."""

from __future__ import annotations

import threading

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
"""JAX times every compile under this name, a compile the persistent cache answered too."""
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class _ThreadCompiles(threading.local):
    count = 0
    cache_hits = 0


_COMPILES = _ThreadCompiles()
_listening = False
_lock = threading.Lock()


def _record_duration(event: str, duration_secs: float, **_: str | int) -> None:
    if event == _COMPILE_EVENT:
        _COMPILES.count += 1


def _record(event: str, **_: str | int) -> None:
    if event == _CACHE_HIT_EVENT:
        _COMPILES.cache_hits += 1


def thread_compiles() -> tuple[int, int]:
    """``(compiled, loaded)``: the XLA compiles the calling thread ran since the first call of this function
    in the process, and the programs it read from the persistent compilation cache instead of compiling."""
    global _listening
    with _lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_record_duration)
            jax.monitoring.register_event_listener(_record)
            _listening = True
    return _COMPILES.count - _COMPILES.cache_hits, _COMPILES.cache_hits
