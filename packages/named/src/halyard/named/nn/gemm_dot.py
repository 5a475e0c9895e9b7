"""`gemm_dot_general`: a contraction whose gradients are plain row-major matrix products (fast on CPU).

For ``y = x · W`` the backward pass needs ``dx = dy · Wᵀ`` and ``dW = xᵀ · dy``. JAX writes both as
``dot_general`` with the contracted dimension in the "wrong" place, and XLA's CPU backend handles that by
copying the larger operand into a transposed layout and running the product on its slower generic
kernel, well below the forward product's speed.
Here every product is a row-major ``[n, k] x [k, o]`` matrix product, and the operand that must be
transposed is transposed explicitly, choosing the smaller one (behind ``optimization_barrier``, so
XLA does not fold the transpose back into the product). The effect on the benchmark step is in
benchmarks/README.md.

On GPUs and TPUs the matrix units read transposed operands for free, so `default_dot_general` uses this
only when JAX's default backend is the CPU. The forward value is the same product; gradients agree with
``jax.lax.dot_general``'s to float rounding (a different summation order).

Inside `halyard.named.nn.batch_invariant` the forward product runs in fixed blocks of rows (on every
backend), so a row's value does not depend on the other rows; the backward products stay whole.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.named.nn.invariance import invariant_matmul, invariant_rows
from halyard.named.nn.target_backend import target_backend

DimensionNumbers = tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]


def default_dot_general(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None, **kwargs: Any
) -> jax.Array:
    """`gemm_dot_general` when the program is for the CPU (`target_backend`) or inside `batch_invariant`,
    ``jax.lax.dot_general`` otherwise.

    Args: as ``jax.lax.dot_general``.
    """
    if target_backend() == "cpu" or invariant_rows() is not None:
        return gemm_dot_general(lhs, rhs, dimension_numbers, precision=precision, **kwargs)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision, **kwargs)


def gemm_dot_general(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None, **kwargs: Any
) -> jax.Array:
    """``jax.lax.dot_general`` computed as one ``[n, k] x [k, o]`` product, forward and backward.

    Contractions with batch dimensions, a ``precision``, keyword arguments other than
    ``preferred_element_type``, operands of different dtypes or with a zero-size dimension go to
    ``jax.lax.dot_general`` unchanged.

    Args:
        lhs: the input ``x``; its free dimensions lead the result.
        rhs: the weight ``W``; its free dimensions follow.
        dimension_numbers: ``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))``.
        precision: passed through (a given precision uses ``jax.lax.dot_general``).
        preferred_element_type: the result (and gradient product) dtype; gradients are returned in the
            operands' dtypes.
    """
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    preferred = kwargs.pop("preferred_element_type", None)
    empty = 0 in lhs.shape or 0 in rhs.shape
    if lhs_batch or rhs_batch or precision is not None or kwargs or lhs.dtype != rhs.dtype or empty:
        if preferred is not None:
            kwargs["preferred_element_type"] = preferred
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision, **kwargs)
    dims = ((tuple(lhs_contract), tuple(rhs_contract)), ((), ()))
    return _gemm(dims, None if preferred is None else jnp.dtype(preferred), invariant_rows(), lhs, rhs)


def _plan(dims: DimensionNumbers, lhs_ndim: int, rhs_ndim: int) -> tuple[list[int], list[int]]:
    """Permutations that bring ``lhs`` to ``[free..., contracted...]`` and ``rhs`` to ``[contracted..., free...]``."""
    (lhs_contract, rhs_contract), _ = dims
    lhs_order = [i for i in range(lhs_ndim) if i not in lhs_contract] + list(lhs_contract)
    rhs_order = list(rhs_contract) + [i for i in range(rhs_ndim) if i not in rhs_contract]
    return lhs_order, rhs_order


def _as_matrices(dims: DimensionNumbers, lhs: jax.Array, rhs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``lhs`` as ``[n, k]`` and ``rhs`` as ``[k, o]`` (permuted by `_plan`, then flattened)."""
    lhs_order, rhs_order = _plan(dims, lhs.ndim, rhs.ndim)
    contracted = math.prod(lhs.shape[i] for i in dims[0][0])
    lhs_matrix = jnp.transpose(lhs, lhs_order).reshape(-1, contracted)
    rhs_matrix = jnp.transpose(rhs, rhs_order).reshape(contracted, -1)
    return lhs_matrix, rhs_matrix


def _transposed(matrix: jax.Array) -> jax.Array:
    """``matrix.T`` materialised (the barrier keeps XLA from folding it into the next product)."""
    return jax.lax.optimization_barrier(matrix.T)


def _transposed_result(product: jax.Array) -> jax.Array:
    """A product's transpose, copied after the product (not folded into it as transposed operands)."""
    return jax.lax.optimization_barrier(product).T


def _restored(product: jax.Array, shape: tuple[int, ...], order: list[int]) -> jax.Array:
    """A gradient ``product`` laid out as ``shape`` permuted by ``order``, back in ``shape``'s order."""
    if order == sorted(order):
        return product.reshape(shape)
    array = jax.lax.optimization_barrier(product).reshape([shape[i] for i in order])
    return array.transpose(np.argsort(order))


def _product(lhs: jax.Array, rhs: jax.Array, preferred: Any) -> jax.Array:
    return jnp.matmul(lhs, rhs, preferred_element_type=preferred)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _gemm(
    dims: DimensionNumbers, preferred: Any, rows: int | None, lhs: jax.Array, rhs: jax.Array
) -> jax.Array:
    """The product; ``rows``: `batch_invariant`'s row block for the forward product, or None."""
    return _gemm_forward(dims, preferred, rows, lhs, rhs)[0]


def _gemm_forward(
    dims: DimensionNumbers, preferred: Any, rows: int | None, lhs: jax.Array, rhs: jax.Array
) -> tuple[jax.Array, tuple]:
    lhs_matrix, rhs_matrix = _as_matrices(dims, lhs, rhs)
    lhs_order, rhs_order = _plan(dims, lhs.ndim, rhs.ndim)
    num_contracted = len(dims[0][0])
    lhs_free = [lhs.shape[i] for i in lhs_order[: lhs.ndim - num_contracted]]
    rhs_free = [rhs.shape[i] for i in rhs_order[num_contracted:]]
    if rows is None:
        product = _product(lhs_matrix, rhs_matrix, preferred)
    else:
        product = invariant_matmul(lhs_matrix, rhs_matrix, rows, preferred)
    output = product.reshape(*lhs_free, *rhs_free)
    # The residuals are the operands themselves: projections of one input (q, k, v) then share one.
    return output, (lhs, rhs)


def _gemm_backward(
    dims: DimensionNumbers, preferred: Any, rows: int | None, residuals: tuple, output_cotangent: jax.Array
) -> tuple:
    lhs, rhs = residuals
    lhs_matrix, rhs_matrix = _as_matrices(dims, lhs, rhs)
    del rows  # the backward products stay whole
    count, contracted = lhs_matrix.shape
    columns = rhs_matrix.shape[1]
    cotangent = output_cotangent.reshape(count, columns)
    if preferred is None:
        cotangent = cotangent.astype(lhs.dtype)
    lhs_gradient = _product(cotangent, _transposed(rhs_matrix).astype(cotangent.dtype), preferred)
    # dW = xᵀ · dy: transpose whichever of x [n, k] and dy [n, o] is smaller.
    if contracted <= columns:
        rhs_gradient = _product(_transposed(lhs_matrix).astype(cotangent.dtype), cotangent, preferred)
    else:
        rhs_gradient = _transposed_result(
            _product(_transposed(cotangent), lhs_matrix.astype(cotangent.dtype), preferred)
        )
    lhs_order, rhs_order = _plan(dims, lhs.ndim, rhs.ndim)
    return (
        _restored(lhs_gradient, lhs.shape, lhs_order).astype(lhs.dtype),
        _restored(rhs_gradient, rhs.shape, rhs_order).astype(rhs.dtype),
    )


_gemm.defvjp(_gemm_forward, _gemm_backward)
