"""`Linear`: an affine map from one group of named axes to another."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.named.axis import Axis, format_axes
from halyard.named.core import NamedArray
from halyard.named.nn._init import as_axes, constant, fan_in, normal
from halyard.named.nn.gemm_dot import default_dot_general

DotGeneral = Callable[..., jax.Array]
"""Anything with the signature of ``jax.lax.dot_general`` (e.g. an fp8 or int8 quantised dot)."""


class Linear(eqx.Module):
    """``y = x · W + b`` contracting the ``In`` axes of ``x`` and producing the ``Out`` axes.

    Both sides may span several axes: ``Linear.init(In=Embed, Out=(Heads, HeadSize))`` is a fused
    query projection, and ``Linear.init(In=(Heads, HeadSize), Out=Embed)`` its output projection.
    Axes of ``x`` other than ``In`` (``batch``, ``pos``, ...) are kept, in their order, followed by ``Out``.

    Attributes:
        weight: a NamedArray with axes ``In + Out``.
        bias: a NamedArray with axes ``Out``, or None.
        In, Out: the input and output axes (static).
        dot_general: the contraction (static): `default_dot_general` (row-major gradient products on
            CPU, ``jax.lax.dot_general`` elsewhere) unless another one (fp8, int8) was given.
    """

    weight: NamedArray
    bias: NamedArray | None
    In: tuple[Axis, ...] = eqx.field(static=True)
    Out: tuple[Axis, ...] = eqx.field(static=True)
    dot_general: DotGeneral = eqx.field(static=True, default=default_dot_general)

    @classmethod
    def init(
        cls,
        In: Axis | Sequence[Axis],
        Out: Axis | Sequence[Axis],
        *,
        key: jax.Array,
        use_bias: bool = True,
        init_std: float | None = None,
        init_scale: float = 1.0,
        dtype: Any = jnp.float32,
        dot_general: DotGeneral | None = None,
    ) -> Linear:
        """A Linear layer with weights drawn from N(0, std**2) and a zero bias.

        Args:
            In: the contracted axis or axes (sizes matter).
            Out: the produced axis or axes; their names must differ from ``In``'s.
            key: PRNG key for the weight.
            use_bias: add a bias over ``Out``.
            init_std: the weight's standard deviation; default ``1 / sqrt(fan_in)`` with fan_in the
                product of the ``In`` sizes (so outputs start with roughly unit variance).
            init_scale: a multiplier on that standard deviation (e.g. ``1 / sqrt(2 * num_layers)`` for
                residual projections).
            dtype: parameter dtype.
            dot_general: replaces `default_dot_general` for the contraction (fp8 / int8 hooks, or
                ``jax.lax.dot_general`` to leave the gradient products to XLA).

        Raises:
            TypeError: ``In`` or ``Out`` holds something other than `Axis` objects.
            ValueError: an axis name appears in both ``In`` and ``Out`` (rename one, e.g.
                ``Axis("embed_out", n)``).
        """
        in_axes = as_axes(In, "Linear In")
        out_axes = as_axes(Out, "Linear Out")
        shared = {a.name for a in in_axes} & {a.name for a in out_axes}
        if shared:
            raise ValueError(
                f"Linear In {format_axes(in_axes)} and Out {format_axes(out_axes)} share the names "
                f"{sorted(shared)}; give the output another name (e.g. Axis('{next(iter(shared))}_out', n))"
            )
        std = (1.0 / math.sqrt(max(fan_in(in_axes), 1)) if init_std is None else init_std) * init_scale
        weight = normal(key, in_axes + out_axes, std, dtype)
        bias = constant(out_axes, 0.0, dtype) if use_bias else None
        return cls(weight, bias, in_axes, out_axes, dot_general or default_dot_general)

    def __call__(self, x: NamedArray) -> NamedArray:
        """Apply the layer.

        Args:
            x: a NamedArray holding every ``In`` axis (any order, same sizes) and no ``Out`` name.

        Returns:
            x's other axes in their order, then ``Out``.

        Raises:
            KeyError / ValueError: an ``In`` axis is missing from ``x`` or has another size.
            ValueError: ``x`` already has an axis named like an ``Out`` axis.
        """
        in_names = {a.name for a in self.In}
        lhs_contract = tuple(x.axis_index(a) for a in self.In)
        rhs_contract = tuple(self.weight.axis_index(a.name) for a in self.In)
        kept = tuple(a for a in x.axes if a.name not in in_names)
        out_axes = tuple(a for a in self.weight.axes if a.name not in in_names)
        clash = {a.name for a in kept} & {a.name for a in out_axes}
        if clash:
            raise ValueError(
                f"Linear input {format_axes(x.axes)} already has the output axis names {sorted(clash)} "
                f"of Out {format_axes(out_axes)}; rename them first (x.rename(...))"
            )
        dtype = jnp.result_type(x.dtype, self.weight.dtype)
        raw = self.dot_general(
            x.array.astype(dtype),
            self.weight.array.astype(dtype),
            ((lhs_contract, rhs_contract), ((), ())),
        )
        y = NamedArray(raw, kept + out_axes)
        if self.bias is not None:
            y = y + self.bias
        return y
