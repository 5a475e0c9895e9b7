"""Weight-only int8 serving (``EngineConfig.quantization="int8"``): every attention and MLP projection of
the model becomes an `Int8Linear`, its weight int8 with one float32 scale per output channel
(`halyard.named.nn.absmax_int8` over the contracted axes).

The weight stays int8 in device memory; the product converts it to the activations' dtype as its operand
(inside the dot's fusion on the TPU, where decoding is bound by reading the weights) and multiplies each
output channel by its scale afterwards: ``x · (q * s) = (x · q) * s`` for a scale per output channel.

The embedding and the output head stay in the model's dtype (a tied head is the embedding table, which the
model's ``logits`` reads as a plain matrix), as do the MoE experts and router and the norms.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.models import CausalLM
from halyard.models.layers.mlp import MLP, GatedMLP
from halyard.models.layers.self_attention import SelfAttention
from halyard.named import NamedArray
from halyard.named.nn import Linear, absmax_int8

QUANTIZATIONS = ("none", "int8")
"""The values of ``EngineConfig.quantization`` and ``--quantization``."""

_QUANTIZED_MODULES = (SelfAttention, MLP, GatedMLP)
"""The modules whose `Linear` fields become `Int8Linear`: q/k/v/o and the MLP's projections."""


class Int8Linear(Linear):
    """A `Linear` whose ``weight`` is int8 and whose output channels are scaled by ``scale``:
    ``y = (x · weight) * scale + bias``, the product in ``x``'s dtype (float32 for int8 against float32).

    Attributes:
        scale: float32 over the weight's axes other than ``In`` (``Out``, and ``layers`` in a stack).
    """

    scale: NamedArray | None = None

    @classmethod
    def quantize(cls, linear: Linear) -> Int8Linear:
        """``linear`` with its weight as int8 and a scale per output channel (per layer in a stack)."""
        weight = linear.weight
        contracted = {axis.name for axis in linear.In}
        reduce = tuple(i for i, axis in enumerate(weight.axes) if axis.name in contracted)
        values, scale = absmax_int8(weight.array, reduce)
        kept = tuple(axis for axis in weight.axes if axis.name not in contracted)
        return cls(
            NamedArray(values, weight.axes),
            linear.bias,
            linear.In,
            linear.Out,
            linear.dot_general,
            NamedArray(jnp.squeeze(scale, reduce), kept),
        )

    def __call__(self, x: NamedArray) -> NamedArray:
        """As `Linear.__call__`; the int8 weight enters the product converted to ``x``'s dtype."""
        if self.scale is None:
            raise ValueError("Int8Linear without a scale: build it with Int8Linear.quantize(linear)")
        product = Linear(self.weight, None, self.In, self.Out, self.dot_general)(x)
        y = (product.astype(jnp.float32) * self.scale.astype(jnp.float32)).astype(product.dtype)
        return y if self.bias is None else y + self.bias


def check_quantization(value: object, option: str = "EngineConfig.quantization") -> str:
    """``value`` if it is one of `QUANTIZATIONS`; otherwise a one-line `ValueError` naming ``option``."""
    if value not in QUANTIZATIONS:
        raise ValueError(f"{option} must be one of {', '.join(QUANTIZATIONS)}, got {value!r}")
    return str(value)


def quantized(model: CausalLM, quantization: str) -> CausalLM:
    """``model`` with its projections in int8 for ``quantization="int8"`` (already quantized ones stay);
    ``model`` itself for ``"none"``. Runs as one compiled program, where the weights are."""
    if check_quantization(quantization) == "none":
        return model
    return _quantize_projections(model)


@eqx.filter_jit
def _quantize_projections(model: CausalLM) -> CausalLM:
    def convert(node: Any) -> Any:
        if not isinstance(node, _QUANTIZED_MODULES):
            return node
        names = [
            name
            for name, value in vars(node).items()
            if isinstance(value, Linear) and not isinstance(value, Int8Linear)
        ]
        return eqx.tree_at(
            lambda module: [getattr(module, name) for name in names],
            node,
            [Int8Linear.quantize(getattr(node, name)) for name in names],
        )

    return jax.tree.map(convert, model, is_leaf=lambda node: isinstance(node, _QUANTIZED_MODULES))


def int8_parameter_bytes(model: CausalLM) -> tuple[int, int]:
    """``(bytes of int8 weights, bytes of every parameter)`` of ``model``."""
    leaves = [leaf for leaf in jax.tree.leaves(model) if hasattr(leaf, "dtype")]
    int8 = sum(leaf.size for leaf in leaves if leaf.dtype == jnp.int8)
    return int8, sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)
