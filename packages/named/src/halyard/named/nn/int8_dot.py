"""`int8_dot_general`: a contraction whose three products (forward, and both gradients) are int8 x int8 -> int32.

For ``y = x · W`` (``x`` ``[tokens..., in...]``, ``W`` ``[in..., out...]``) the forward pass quantizes ``x``
per token and ``W`` per output channel, each with its scale over the contracted ``in`` dimensions
(`absmax_int8`), so both scales factor out of the integer sum:

    y[t, o] = sx[t] * sw[o] * sum_i qx[t, i] qw[i, o]

The backward pass reuses those int8 operands (AQT's ``use_fwd_quant``): a scale that varies along a
gradient product's contracted dimension is folded into the other operand, the cotangent, which is then
quantized with its scale over that product's contracted dimensions, rounding stochastically:

    dx[t, i] = sum_o (dy[t, o] sw[o]) qw[i, o]   = s1[t] * sum_o q1[t, o] qw[i, o]     q1: dy * sw, per token
    dW[i, o] = sum_t qx[t, i] (sx[t] dy[t, o])   = s2[o] * sum_t qx[t, i] q2[t, o]     q2: dy * sx, per channel

So the residuals are int8 (half the bytes of bf16 operands) and every product runs on the int8 matrix
units. The forward operands round to nearest; the cotangents round stochastically (`absmax_int8`'s
``stochastic``, AQT's default for gradients), which keeps each gradient unbiased: ``q2``'s one scale per
channel spans thousands of tokens, and to nearest the many tokens whose gradients are far below the few
largest all round to zero, so ``dW`` lost their sum (rounded to nearest, issue 68's quality run ended 5.6%
above bfloat16's validation loss). The noise is a hash of the cotangent's bits and positions, so the same
inputs give the same bits and a resumed run repeats its steps exactly. Under `checkpoint_layer`'s ``"save_dots"`` the rescaled output is kept (its
name, `INT8_PROJECTION`), not the int32 sums, and the int8 operands are recomputed from the layer's inputs.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from halyard.named.nn.int8 import absmax_int8
from halyard.named.nn.remat import INT8_PROJECTION

Dims = tuple[int, ...]
Dtypes = tuple[Any, Any, Any]


def int8_dot_general(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None, **kwargs: Any
) -> jax.Array:
    """``jax.lax.dot_general(lhs, rhs, dimension_numbers)`` computed with int8 operands (module docstring).

    Args:
        lhs: the input ``x``, floating point; its free dimensions (tokens) lead the result.
        rhs: the weight ``W``, floating point; its free dimensions (output channels) follow.
        dimension_numbers: ``((lhs_contracting, rhs_contracting), ((), ()))``: no batch dimensions.
        precision: ignored (the products are exact integer sums).
        preferred_element_type: the result dtype (default: ``lhs`` and ``rhs``'s common dtype, as
            ``jax.lax.dot_general``); gradients come back in the operands' dtypes.

    Raises:
        ValueError: the contraction has batch dimensions, or another keyword argument is given.
    """
    del precision
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    preferred = kwargs.pop("preferred_element_type", None)
    if lhs_batch or rhs_batch or kwargs:
        raise ValueError(
            "int8_dot_general quantizes a projection (no batch dimensions, no options other than "
            f"preferred_element_type); got batch dimensions {(lhs_batch, rhs_batch)} and options {sorted(kwargs)}"
        )
    output = jnp.dtype(preferred) if preferred is not None else jnp.result_type(lhs.dtype, rhs.dtype)
    dtypes = (output, jnp.dtype(lhs.dtype), jnp.dtype(rhs.dtype))
    return _int8_dot(tuple(lhs_contract), tuple(rhs_contract), dtypes, lhs, rhs)


def _free(ndim: int, contracted: Dims) -> Dims:
    return tuple(i for i in range(ndim) if i not in contracted)


def _integer_product(lhs: jax.Array, rhs: jax.Array, lhs_contract: Dims, rhs_contract: Dims) -> jax.Array:
    """The int32 sum of an int8 x int8 contraction (``lhs``'s free dimensions, then ``rhs``'s)."""
    dims = ((lhs_contract, rhs_contract), ((), ()))
    return jax.lax.dot_general(lhs, rhs, dims, preferred_element_type=jnp.int32)


def _squeezed(scale: jax.Array, dims: Dims) -> jax.Array:
    """A scale from `absmax_int8` without its size-1 ``dims``."""
    return scale.reshape([n for i, n in enumerate(scale.shape) if i not in dims])


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _int8_dot(
    lhs_contract: Dims, rhs_contract: Dims, dtypes: Dtypes, lhs: jax.Array, rhs: jax.Array
) -> jax.Array:
    """The product; ``dtypes``: the result's, ``lhs``'s and ``rhs``'s (their gradients')."""
    return _forward(lhs_contract, rhs_contract, dtypes, lhs, rhs)[0]


def _forward(
    lhs_contract: Dims, rhs_contract: Dims, dtypes: Dtypes, lhs: jax.Array, rhs: jax.Array
) -> tuple[jax.Array, tuple]:
    lhs_q, lhs_scale = absmax_int8(lhs, lhs_contract)  # per token
    rhs_q, rhs_scale = absmax_int8(rhs, rhs_contract)  # per output channel
    token_scale = _squeezed(lhs_scale, lhs_contract)
    channel_scale = _squeezed(rhs_scale, rhs_contract)
    total = _integer_product(lhs_q, rhs_q, lhs_contract, rhs_contract)
    token_scale = token_scale.reshape(token_scale.shape + (1,) * channel_scale.ndim)
    output = (total.astype(jnp.float32) * token_scale * channel_scale).astype(dtypes[0])
    output = checkpoint_name(output, INT8_PROJECTION)  # what save_dots keeps, rather than the int32 sums
    return output, (lhs_q, token_scale, rhs_q, channel_scale)


def _backward(
    lhs_contract: Dims, rhs_contract: Dims, dtypes: Dtypes, residuals: tuple, cotangent: jax.Array
) -> tuple:
    lhs_q, token_scale, rhs_q, channel_scale = residuals
    lhs_free, rhs_free = _free(lhs_q.ndim, lhs_contract), _free(rhs_q.ndim, rhs_contract)
    num_tokens_dims = len(lhs_free)
    cotangent_tokens = tuple(range(num_tokens_dims))
    cotangent_channels = tuple(range(num_tokens_dims, cotangent.ndim))
    wide = cotangent.astype(jnp.float32)

    # dx = (dy * sw) · qwᵀ, contracted over the output channels; dy * sw quantized per token.
    q1, s1 = absmax_int8(wide * channel_scale, cotangent_channels, stochastic=True)
    lhs_total = _integer_product(q1, rhs_q, cotangent_channels, rhs_free)
    lhs_gradient = lhs_total.astype(jnp.float32) * _squeezed(s1, cotangent_channels).reshape(
        lhs_total.shape[:num_tokens_dims] + (1,) * len(lhs_contract)
    )
    # lhs_total's dimensions: lhs_free, then rhs_contract in rhs's order; put lhs_contract's back in place.
    order_in_rhs = np.argsort(rhs_contract)
    produced = list(lhs_free) + [lhs_contract[k] for k in order_in_rhs]
    lhs_gradient = lhs_gradient.transpose(np.argsort(produced))

    # dW = qxᵀ · (dy * sx), contracted over the tokens; dy * sx quantized per output channel.
    q2, s2 = absmax_int8(wide * token_scale, cotangent_tokens, stochastic=True)
    rhs_total = _integer_product(lhs_q, q2, lhs_free, cotangent_tokens)
    rhs_gradient = rhs_total.astype(jnp.float32) * _squeezed(s2, cotangent_tokens)
    # rhs_total's dimensions: lhs_contract in lhs's order, then rhs_free; each lhs_contract[k] is rhs_contract[k].
    order_in_lhs = np.argsort(lhs_contract)
    produced = [rhs_contract[k] for k in order_in_lhs] + list(rhs_free)
    rhs_gradient = rhs_gradient.transpose(np.argsort(produced))
    return lhs_gradient.astype(dtypes[1]), rhs_gradient.astype(dtypes[2])


_int8_dot.defvjp(_forward, _backward)
