"""Running Pallas TPU kernels that move data by DMA on a CPU: Pallas's TPU interpreter, with what it lacks
for JAX's ragged paged attention kernel.

JAX's TPU kernels that copy pages by hand (``pltpu.make_async_copy``, semaphores, double buffers) run off
TPU only in the TPU interpreter (``pltpu.force_tpu_interpret_mode``), which simulates HBM, VMEM, DMAs and
semaphores; Pallas's older interpreter (``interpret=True``) has no strided loads. In JAX 0.10.2 the TPU
interpreter stops at two things the ragged paged attention kernel does:

- a load through a reshaped or bitcast ref (``kv_bufs.at[i].reshape(...)[start::step]``, and for 16-bit
  caches ``.bitcast(jnp.uint32)``): its reads handle index transforms only
  (``AttributeError: 'ReshapeTransform' object has no attribute 'indices'``);
- a masked store into a block narrower than the buffer's first axis (``pltpu.store(..., mask=...)`` into
  ``acc_ref.at[:, heads]``): its bounds check marks the in-bounds part along axis 0 for every axis, so an
  in-bounds store is refused as out of bounds.

`tpu_interpret_mode` mends both in the interpreter's read and store callbacks: a read through reshapes and
bitcasts reads the untransformed block and applies the transforms in numpy (the bitcast packs the
second-minor axis, as the TPU and `jax._src.state.utils.bitcast` do); a masked store reads the block, merges
in numpy, and stores it whole. Reads and stores the interpreter handles go to it unchanged. The mends
reach into JAX's private interpreter (``jax._src.pallas.mosaic.interpret``); a JAX without those names
gets a one-line error naming the version.

DMAs run when they are started (the interpreter's ``dma_execution_mode="eager"``), so a copy that is started
and never waited for leaves its semaphore nonzero at the kernel's exit, which the interpreter reports on
stdout (``Semaphore ... has non-zero count ... at kernel exit``; on a TPU the same halts the chip).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

_installed = False


@contextlib.contextmanager
def tpu_interpret_mode() -> Iterator[None]:
    """Pallas TPU kernels bound inside run in the TPU interpreter (on any backend), DMAs eager, with the
    mends of the module docstring installed (they stay installed: programs traced here are lowered later,
    outside).

    Raises:
        RuntimeError: this JAX's TPU interpreter lacks the private functions the mends wrap.
    """
    from jax.experimental.pallas import tpu as pltpu

    _install()
    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(dma_execution_mode="eager")):
        yield


def _install() -> None:
    global _installed
    if _installed:
        return
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpreter
        from jax._src.state import indexing
        from jax._src.state import types as state_types

        inner_get, inner_swap = interpreter.get.__wrapped__, interpreter.swap.__wrapped__
        wrap = interpreter.fail_on_exception
    except (ImportError, AttributeError) as error:
        raise RuntimeError(
            f"Pallas TPU interpret mode: JAX {jax.__version__} has no interpreter callback the mends of "
            f"halyard.models.attention.pallas_interpret wrap ({error}); run the kernel on a TPU"
        ) from error
    # `wrap` keeps the mended function as ``__wrapped__``, which the interpreter's DMAs call directly.
    interpreter.get = wrap(functools.partial(_get, inner_get, indexing, state_types))
    interpreter.swap = wrap(functools.partial(_swap, inner_get, inner_swap))
    _installed = True


def _get(
    inner_get: Callable, indexing: Any, state_types: Any, token: Any, device_id: Any, local_core_id: Any,
    memory_space: Any, buffer_id: Any, transforms: Any, *args: Any, **kwargs: Any,
) -> tuple[Any, np.ndarray]:  # fmt: skip
    """The interpreter's read, through reshapes and bitcasts after the leading index transforms."""
    transforms = tuple(transforms)
    plain = next(
        (i for i, t in enumerate(transforms) if not isinstance(t, indexing.NDIndexer)), len(transforms)
    )
    token, value = inner_get(
        token, device_id, local_core_id, memory_space, buffer_id, transforms[:plain], *args, **kwargs
    )
    for transform in transforms[plain:]:
        if isinstance(transform, state_types.ReshapeTransform):
            value = value.reshape(transform.shape)
        elif isinstance(transform, state_types.BitcastTransform):
            value = _bitcast(value, np.dtype(transform.dtype))
        elif isinstance(transform, indexing.NDIndexer):
            value = value[_numpy_index(transform, indexing)]
        else:
            raise NotImplementedError(f"Pallas TPU interpret mode: a read through {transform!r}")
    return token, value


def _swap(
    inner_get: Callable, inner_swap: Callable, token: Any, device_id: Any, local_core_id: Any,
    memory_space: Any, buffer_id: Any, transforms: Any, value: Any, mask: Any, **kwargs: Any,
) -> tuple[Any, np.ndarray]:  # fmt: skip
    """The interpreter's store; a masked one merges the old block with the new in numpy, then stores."""
    where = (token, device_id, local_core_id, memory_space, buffer_id, transforms)
    if mask is None:
        return inner_swap(*where, value, None, **kwargs)
    token, old = inner_get(*where, source_info=kwargs.get("source_info"))
    merged = np.where(np.asarray(mask), np.asarray(value), old)
    return inner_swap(token, *where[1:], merged, None, **kwargs)


def _numpy_index(indexer: Any, indexing: Any) -> tuple[int | slice, ...]:
    """A Pallas index (``Slice(start, size, stride)`` or an int per axis) as a numpy index."""
    index: list[int | slice] = []
    for entry in indexer.indices:
        if isinstance(entry, indexing.Slice):
            start, size, stride = int(entry.start), int(entry.size), int(entry.stride)
            index.append(slice(start, start + size * stride, stride))
        else:
            index.append(int(entry))
    return tuple(index)


def _bitcast(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A TPU ref bitcast to a wider type: ``ratio`` consecutive rows of the second-minor axis become one
    row, the first in the lowest bits (`jax._src.state.utils.bitcast`'s layout)."""
    if value.dtype.itemsize == dtype.itemsize:
        return value.view(dtype)
    if value.dtype.itemsize > dtype.itemsize:
        raise NotImplementedError(f"Pallas TPU interpret mode: a read bitcast {value.dtype} -> {dtype}")
    ratio = dtype.itemsize // value.dtype.itemsize
    *lead, rows, lanes = value.shape
    grouped = value.reshape(*lead, rows // ratio, ratio, lanes).swapaxes(-1, -2)
    return np.ascontiguousarray(grouped).view(dtype)[..., 0]
