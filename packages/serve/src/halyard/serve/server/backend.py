"""`start_backend`: JAX's backend (the accelerator's runtime: seconds on a TPU) starting in a thread of its own,
while the command that will need it goes on importing modules and reading a checkpoint into host memory.

The thread only calls ``jax.devices()``. JAX starts a backend under a lock: a JAX call on another thread that
needs a device waits for the start and then proceeds, so nothing here can deadlock. The start is started
after ``import jax`` has completed, so the thread does not import modules that the main thread may be in the
middle of importing. An error of the start (no TPU, a TPU held by another process) is raised again where
the caller waits for it (`BackendStart.wait`), as ``jax.devices()`` there would have raised it.
"""

from __future__ import annotations

import functools
import threading

import jax


class BackendStart:
    """JAX's backend starting in a daemon thread (made by `start_backend`)."""

    def __init__(self) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="halyard-backend-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            jax.devices()
        except BaseException as error:  # raised again in the thread that waits (`wait`)
            self._error = error

    def wait(self) -> None:
        """Return once the backend has started.

        Raises:
            The exception ``jax.devices()`` raised in the thread (the same object, its traceback kept).
        """
        self._thread.join()
        if self._error is not None:
            raise self._error


@functools.cache
def start_backend() -> BackendStart:
    """The process's one `BackendStart`, begun on the first call (JAX's backend is one per process too).

    Call it once the options that must be set before JAX starts are set (``XLA_FLAGS``, ``JAX_PLATFORMS``,
    `halyard.named.nn.unfuse_multiply_add`), before the rest of a command's start: ``halyard serve`` calls it
    right after checking its options, and `load_hf_folder` waits for it only once the folder is in host
    memory.
    """
    return BackendStart()
