"""`LayerNorm` and `RMSNorm` over named axes.

Statistics are computed in float32 whatever the input dtype (bf16 variance is too coarse), and the
result is cast back to the input's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax.numpy as jnp

from halyard.named.axis import Axis
from halyard.named.core import NamedArray
from halyard.named.nn._init import as_axes, constant
from halyard.named.nn.invariance import inverse_sqrt, row_mean


def _names(axes: tuple[Axis, ...]) -> tuple[str, ...]:
    return tuple(a.name for a in axes)


def _check_input(x: NamedArray, axes: tuple[Axis, ...], layer: str) -> None:
    if not isinstance(x, NamedArray):
        raise TypeError(f"{layer} expects a NamedArray, got {type(x).__name__}")
    for axis in axes:
        x.axis_index(axis)  # KeyError / ValueError naming x's axes


def _affine(y: NamedArray, weight: NamedArray | None, bias: NamedArray | None, dtype: Any) -> NamedArray:
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.astype(dtype)


class LayerNorm(eqx.Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` with statistics over ``axes``.

    Attributes:
        weight: NamedArray over ``axes`` (initialised to ones), or None.
        bias: NamedArray over ``axes`` (initialised to zeros), or None.
        axes: the normalised axis or axes (static).
        eps: added to the variance (static).
    """

    weight: NamedArray | None
    bias: NamedArray | None
    axes: tuple[Axis, ...] = eqx.field(static=True)
    eps: float = eqx.field(static=True, default=1e-5)

    @classmethod
    def init(
        cls,
        axes: Axis | Sequence[Axis],
        *,
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: Any = jnp.float32,
    ) -> LayerNorm:
        """A LayerNorm over ``axes`` (e.g. ``Axis("embed", 768)``).

        Args:
            axes: the axis (or axes) to normalise over; the parameters span it.
            eps: variance floor.
            use_weight, use_bias: include the learned scale / shift.
            dtype: parameter dtype.
        """
        normalised = as_axes(axes, "LayerNorm axes")
        weight = constant(normalised, 1.0, dtype) if use_weight else None
        bias = constant(normalised, 0.0, dtype) if use_bias else None
        return cls(weight, bias, normalised, eps)

    def __call__(self, x: NamedArray) -> NamedArray:
        """Normalise ``x`` over ``axes``; other axes are independent. Axes and dtype are kept.

        Raises:
            KeyError / ValueError: ``x`` lacks the normalised axis or has it with another size.
        """
        _check_input(x, self.axes, "LayerNorm")
        names = _names(self.axes)
        xf = x.astype(jnp.float32)
        mean = row_mean(xf, names)
        centred = xf - mean
        variance = row_mean(centred * centred, names)
        y = centred * NamedArray(inverse_sqrt(variance.array + self.eps), variance.axes)
        return _affine(y, self.weight, self.bias, x.dtype)


class RMSNorm(eqx.Module):
    """``x / sqrt(mean(x**2) + eps) * (offset + weight) (+ bias)`` over ``axes`` (Llama, T5; Gemma: offset 1).

    Attributes:
        weight: NamedArray over ``axes`` (initialised so that ``offset + weight`` is one), or None.
        bias: NamedArray over ``axes`` (zeros), or None (the default: Llama has none).
        axes: the normalised axis or axes (static).
        eps: added to the mean square (static).
        offset: added to the weight when it is applied (static; Gemma stores ``scale - 1``).
    """

    weight: NamedArray | None
    bias: NamedArray | None
    axes: tuple[Axis, ...] = eqx.field(static=True)
    eps: float = eqx.field(static=True, default=1e-6)
    offset: float = eqx.field(static=True, default=0.0)

    @classmethod
    def init(
        cls,
        axes: Axis | Sequence[Axis],
        *,
        eps: float = 1e-6,
        use_weight: bool = True,
        use_bias: bool = False,
        offset: float = 0.0,
        dtype: Any = jnp.float32,
    ) -> RMSNorm:
        """An RMSNorm over ``axes``.

        Args:
            axes: the axis (or axes) to normalise over; the parameters span it.
            eps: floor of the mean square.
            use_weight, use_bias: include the learned scale / shift.
            offset: added to the weight when applied (the weight starts at ``1 - offset``).
            dtype: parameter dtype.
        """
        normalised = as_axes(axes, "RMSNorm axes")
        weight = constant(normalised, 1.0 - offset, dtype) if use_weight else None
        bias = constant(normalised, 0.0, dtype) if use_bias else None
        return cls(weight, bias, normalised, eps, offset)

    def __call__(self, x: NamedArray) -> NamedArray:
        """Normalise ``x`` over ``axes``; axes and dtype are kept.

        Raises:
            KeyError / ValueError: ``x`` lacks the normalised axis or has it with another size.
        """
        _check_input(x, self.axes, "RMSNorm")
        xf = x.astype(jnp.float32)
        mean_square = row_mean(xf * xf, _names(self.axes))
        y = xf * NamedArray(inverse_sqrt(mean_square.array + self.eps), mean_square.axes)
        weight = self.weight
        if weight is not None and self.offset:
            weight = weight.astype(jnp.float32) + self.offset
        return _affine(y, weight, self.bias, x.dtype)
