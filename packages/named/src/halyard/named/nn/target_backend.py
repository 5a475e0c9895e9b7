"""`compiling_for`: trace a program as it would be traced for another backend (`halyard plan` on a laptop).

Some choices depend on the backend that runs the program: `default_dot_general` writes the gradient products
as row-major matrix products on CPU only, and attention picks its kernel per backend. `halyard plan` compiles a
TPU's or GPU's step on simulated CPU devices to read its memory; inside ``compiling_for("tpu")`` those choices
follow the TPU's, so the planned program is the accelerator's (where it can run on CPU at all).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("halyard_target_backend", default=None)
_COMPILED_ON: contextvars.ContextVar[str | None] = contextvars.ContextVar("halyard_compiled_on", default=None)


@contextlib.contextmanager
def compiling_for(backend: str | None, compiled_on: str | None = None) -> Iterator[None]:
    """Within the block, `target_backend` is ``backend`` (``cpu``, ``gpu``, ``tpu``); None: JAX's own.

    Args:
        backend: the backend the program is traced for.
        compiled_on: the platform of the devices it compiles for (a TPU topology's ``tpu`` on a CPU-only
            machine); None: ``jax.default_backend()``.
    """
    token, compiled = _TARGET.set(backend), _COMPILED_ON.set(compiled_on)
    try:
        yield
    finally:
        _TARGET.reset(token)
        _COMPILED_ON.reset(compiled)


def traced_elsewhere() -> bool:
    """Whether the program is traced for another backend than the one it compiles for (then kernels that
    only the target runs, such as Pallas TPU kernels, need a stand-in)."""
    compiled_on = _COMPILED_ON.get() or jax.default_backend()
    return target_backend() != compiled_on


def target_backend() -> str:
    """The backend the program being traced is for: `compiling_for`'s, else ``jax.default_backend()``."""
    target = _TARGET.get()
    return jax.default_backend() if target is None else target
