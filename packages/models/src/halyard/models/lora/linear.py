"""`LoraLinear`: a `Linear` with a `LoraAdapter` added to its output."""

from __future__ import annotations

import jax.numpy as jnp

from halyard.models.lora.adapter import LoraAdapter
from halyard.named import NamedArray
from halyard.named.nn import Linear


class LoraLinear(Linear):
    """``y = x · W + b + (dropout(x) · A · B) * alpha / rank``.

    A `Linear` (same ``weight`` and ``bias`` paths, so the base weights load, save and shard as before)
    whose ``adapter`` adds the low-rank term; without an adapter it is the plain layer.

    Attributes:
        adapter: the `LoraAdapter`, or None.
    """

    adapter: LoraAdapter | None = None

    @classmethod
    def wrap(cls, linear: Linear, adapter: LoraAdapter | None) -> LoraLinear:
        """``linear`` (its weight, bias, axes and contraction) with ``adapter`` added."""
        return cls(linear.weight, linear.bias, linear.In, linear.Out, linear.dot_general, adapter)

    def base(self) -> Linear:
        """The plain layer without the adapter."""
        return Linear(self.weight, self.bias, self.In, self.Out, self.dot_general)

    def merged(self) -> Linear:
        """A plain layer computing the same function: ``W + A · B * alpha / rank`` in the weight's dtype
        (the sum in float32)."""
        if self.adapter is None:
            return self.base()
        delta = self.adapter.delta().rearrange(*self.weight.axis_names)
        weight = NamedArray(
            (self.weight.array.astype(jnp.float32) + delta.array).astype(self.weight.dtype), self.weight.axes
        )
        return Linear(weight, self.bias, self.In, self.Out, self.dot_general)

    def __call__(self, x: NamedArray) -> NamedArray:
        """As `Linear.__call__`, plus the adapter's term."""
        y = super().__call__(x)
        if self.adapter is None:
            return y
        return y + self.adapter(x, self.In, self.Out, self.dot_general).astype(y.dtype)
