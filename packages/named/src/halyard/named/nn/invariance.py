"""Batch-invariant arithmetic: a row's numbers do not depend on how many other rows share its program.

XLA rounds a matrix product's row differently depending on the product's row count (its CPU kernels pick
their blocking and summation order from the shape), sums a row in another order when the whole array is
small (under about 4,096 elements on CPU), and contracts a multiply and an add into one fused multiply-add
wherever both land in the same fused loop, which depends on the rest of the program. So the same token's
log-probability comes out a few ulps apart from an inference engine's step (32 decoding rows) and from a
training step (thousands of rows, other fusions). These rules remove those sources:

- inside `batch_invariant`, every product of `halyard.named.nn.Linear` (and any caller of
  `invariant_matmul`) runs in blocks of exactly ``rows`` rows, the last block padded with zeros: every row
  is computed by the same ``[rows, k] x [k, o]`` product whatever else is in the batch (the backward pass
  keeps the plain products: gradients need no invariance);
- inside `batch_invariant`, the sums along a row of the normalisations, the attention kernels and the
  (log-)softmaxes over the vocabulary are `row_sum`'s fixed halving order (elementwise adds, which XLA
  computes the same way at every size) instead of XLA's reduction;
- inside `batch_invariant`, the rotary embedding's ``cos`` and ``sin`` are computed in blocks of ``rows``
  positions (`in_row_blocks`);
- inside `batch_invariant`, `inverse_sqrt` is XLA's ``rsqrt`` (which a program that differentiates a
  normalisation would otherwise substitute for ``1 / sqrt`` in its forward pass alone);
- in a process where `unfuse_multiply_add` ran before JAX started its CPU backend, no program contracts a
  multiply and an add (XLA's CPU code generator is limited to AVX, which has no fused multiply-add; the
  setting is the process's, XLA reads it once), so fusion cannot change a value.

Elementwise operations (and maxima, which are exact) are row-invariant anyway. `halyard.serve`'s
``EngineConfig.training_arithmetic`` and ``trainer.objective: grpo`` with ``rl.deterministic`` use all of them,
so on an x86 CPU the sampler's log-probabilities equal the trainer's bit for bit.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import platform
from collections.abc import Iterator, MutableMapping
from typing import Any

import jax
import jax.numpy as jnp

from halyard.named.core import NamedArray

ROW_BLOCK = 32
"""Rows per product block: a decoding program's rows in `halyard.serve`'s deterministic mode."""

_ROWS: contextvars.ContextVar[int | None] = contextvars.ContextVar("halyard_invariant_rows", default=None)


@contextlib.contextmanager
def batch_invariant(rows: int = ROW_BLOCK) -> Iterator[None]:
    """While tracing inside this context, `Linear` products run in blocks of ``rows`` rows and the row sums,
    softmaxes and norms take their fixed-order forms (see the module docstring). It acts when a function is
    traced, not when it runs: enter it inside the jitted function, or around ``jax.jit(f).lower(...)`` of a
    function traced only there.

    Args:
        rows: rows per block (a positive int).
    """
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"batch_invariant: rows must be a positive int, got {rows!r}")
    token = _ROWS.set(rows)
    try:
        yield
    finally:
        _ROWS.reset(token)


def invariant_rows() -> int | None:
    """The row block of the enclosing `batch_invariant` context, or None outside one."""
    return _ROWS.get()


def invariant_matmul(lhs: jax.Array, rhs: jax.Array, rows: int, preferred: Any = None) -> jax.Array:
    """``lhs [n, k] @ rhs [k, o]`` computed ``rows`` rows at a time (``n`` padded up to a multiple).

    Args:
        lhs, rhs: the matrices.
        rows: rows per product.
        preferred: the product's ``preferred_element_type`` (None: the operands' type).
    """
    count = lhs.shape[0]
    blocks = -(-count // rows)
    padded = jnp.pad(lhs, ((0, blocks * rows - count), (0, 0))).reshape(blocks, rows, lhs.shape[1])
    products = jax.lax.map(lambda block: jnp.matmul(block, rhs, preferred_element_type=preferred), padded)
    return products.reshape(blocks * rows, rhs.shape[1])[:count]


def in_row_blocks(function: Any, x: jax.Array, rows: int) -> jax.Array:
    """``function(x)`` for an ``x [n, ...]`` whose rows ``function`` computes independently (elementwise math
    such as ``sin``), computed ``rows`` rows at a time (``n`` padded up to a multiple): every program runs
    the same compiled block whatever ``n`` is (XLA's CPU code computes a transcendental of a short array
    on another path than a long one's, a last bit apart)."""
    count = x.shape[0]
    blocks = -(-count // rows)
    padded = jnp.pad(x, [(0, blocks * rows - count)] + [(0, 0)] * (x.ndim - 1))
    results = jax.lax.map(function, padded.reshape(blocks, rows, *x.shape[1:]))
    return results.reshape(blocks * rows, *results.shape[2:])[:count]


def row_sum(x: jax.Array) -> jax.Array:
    """``x``'s sum along its last axis: inside `batch_invariant` by adding halves until one element is left
    (a fixed order, the same for every row whatever the array's size), else ``jnp.sum``."""
    if invariant_rows() is None:
        return jnp.sum(x, axis=-1)
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, 1)])
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def row_mean(x: NamedArray, names: tuple[str, ...]) -> NamedArray:
    """``x.mean(names)``, its sum by `row_sum` inside `batch_invariant`."""
    if invariant_rows() is None:
        return x.mean(names)
    ordered = x.rearrange(*(a.name for a in x.axes if a.name not in names), *names)
    kept = ordered.axes[: ordered.ndim - len(names)]
    count = 1
    for axis in ordered.axes[len(kept) :]:
        count *= axis.size
    flat = ordered.array.reshape(*ordered.array.shape[: len(kept)], count)
    return NamedArray(row_sum(flat) / count, kept)


def inverse_sqrt(x: jax.Array) -> jax.Array:
    """``1 / sqrt(x)``; inside `batch_invariant` XLA's ``rsqrt`` (XLA rewrites ``1 / sqrt`` into ``rsqrt`` in
    some programs, one that differentiates it, and not in others: written as ``rsqrt``, every program
    computes the same)."""
    if invariant_rows() is None:
        return jnp.reciprocal(jnp.sqrt(x))
    return jax.lax.rsqrt(x)


def row_log_softmax(x: jax.Array) -> jax.Array:
    """``jax.nn.log_softmax(x, axis=-1)``, its sum by `row_sum` inside `batch_invariant`."""
    if invariant_rows() is None:
        return jax.nn.log_softmax(x, axis=-1)
    largest = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    shifted = x - jnp.where(jnp.isfinite(largest), largest, 0.0)
    return shifted - jnp.log(row_sum(jnp.exp(shifted)))[..., None]


def row_softmax(x: jax.Array) -> jax.Array:
    """``jax.nn.softmax(x, axis=-1)``, its sum by `row_sum` inside `batch_invariant`."""
    if invariant_rows() is None:
        return jax.nn.softmax(x, axis=-1)
    largest = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    weights = jnp.exp(x - jnp.where(jnp.isfinite(largest), largest, 0.0))
    return weights / row_sum(weights)[..., None]


UNFUSED_FLAG = "--xla_cpu_max_isa=AVX"
"""The ``XLA_FLAGS`` entry that keeps XLA's CPU code generator from fused multiply-adds (x86)."""


def unfuse_multiply_add(environ: MutableMapping[str, str] | None = None) -> bool:
    """Add `UNFUSED_FLAG` to ``XLA_FLAGS`` unless XLA already runs (it reads its flags once, when JAX starts
    its CPU backend), on x86 machines.

    Args:
        environ: the environment to change (default: this process's, which child processes inherit).

    Returns:
        Whether this process's CPU programs compile without fused multiply-adds: the flag was set before the
        backend started, or is set now and the backend has not started.
    """
    environ = os.environ if environ is None else environ
    flags = environ.get("XLA_FLAGS", "")
    if "--xla_cpu_max_isa=" in flags:
        return UNFUSED_FLAG in flags.split()
    if platform.machine().lower() not in ("x86_64", "amd64") or _backend_started():
        return False
    environ["XLA_FLAGS"] = f"{flags} {UNFUSED_FLAG}".strip()
    return True


def _backend_started() -> bool:
    from jax._src import xla_bridge  # no public way to ask whether XLA has read its flags

    return bool(xla_bridge.backends_are_initialized())
