"""How many XLA compiles the calling thread has run: a program jitted on first call (the engine's store
program) compiles inside the call, or finds the program compiled already (by this engine or another engine
of the process); the count around the call tells which, whatever else other threads compile meanwhile."""

from __future__ import annotations

import threading

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class _ThreadCompiles(threading.local):
    count = 0


_COMPILES = _ThreadCompiles()
_listening = False
_lock = threading.Lock()


def _record(event: str, duration_secs: float, **_: str | int) -> None:
    if event == _COMPILE_EVENT:
        _COMPILES.count += 1


def thread_compiles() -> int:
    """XLA compiles run by the calling thread since the first call of this function in the process."""
    global _listening
    with _lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_record)
            _listening = True
    return _COMPILES.count
