"""Weight-only int8 serving (``EngineConfig.quantization="int8"``): every attention and MLP projection of
the model becomes an `Int8Linear`, its weight int8 with one float32 scale per output channel
(`halyard.named.nn.absmax_int8` over the contracted axes), and the output head is read from an int8 copy
with a scale per vocabulary row (`Int8HeadModel`).

The weights stay int8 in device memory; a product converts them to the activations' dtype as its operand
(inside the dot's fusion on the TPU, where decoding is bound by reading the weights) and multiplies each
output channel by its scale afterwards: ``x · (q * s) = (x · q) * s`` for a scale per output channel.

The embedding lookup reads the model's own table (a decode step reads one row per token of it), and the
norms, MoE experts and router stay in the model's dtype.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import halyard.named as hn
from halyard.models import CausalLM
from halyard.models.attention import AttentionMask
from halyard.models.layers.mlp import MLP, GatedMLP
from halyard.models.layers.paged_kv import PagedKV
from halyard.models.layers.self_attention import SelfAttention
from halyard.models.model import DecoderOutput, unembed
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


class Int8HeadModel(CausalLM):
    """``inner`` whose logits come from an int8 copy of its output matrix, one float32 scale per vocabulary
    row: ``(hidden · head) * head_scale``. Everything else (the decoder, the embedding lookup, the pool) is
    ``inner``'s.

    Attributes:
        inner: the model (its projections `Int8Linear` when built by `quantized`).
        head: int8 ``inner.unembedding`` (``vocab`` and ``embed``).
        head_scale: float32 over ``vocab``.
    """

    inner: CausalLM
    head: NamedArray
    head_scale: NamedArray

    @classmethod
    def wrap(cls, inner: CausalLM) -> Int8HeadModel:
        """``inner`` with its output matrix quantized."""
        matrix = inner.unembedding
        values, scale = absmax_int8(matrix.array, matrix.axis_index("embed"))
        vocab = tuple(axis for axis in matrix.axes if axis.name != "embed")
        return cls(inner, NamedArray(values, matrix.axes), NamedArray(scale.reshape(-1), vocab))

    @property
    def model_config(self) -> Any:
        return self.inner.model_config

    def decoder(
        self, tokens: NamedArray, *, mask: AttentionMask, positions: NamedArray, cache: PagedKV | None = None
    ) -> DecoderOutput:
        return self.inner.decoder(tokens, mask=mask, positions=positions, cache=cache)

    @property
    def unembedding(self) -> NamedArray:
        """The int8 head times its scales (for callers other than `logits`, which scales after the product)."""
        return self.head.astype(jnp.float32) * self.head_scale

    @property
    def position_limit(self) -> int | None:
        return self.inner.position_limit

    @property
    def logit_softcap(self) -> float | None:
        return self.inner.logit_softcap

    def init_pages(self, num_pages: int, page_size: int, implementation: str = "auto") -> PagedKV:
        return self.inner.init_pages(num_pages, page_size, implementation)

    def logits(self, hidden: NamedArray) -> NamedArray:
        """float32 logits: the int8 head converted to ``hidden``'s dtype in the product, then scaled."""
        product = unembed(hidden, self.head.astype(hidden.dtype))  # batch-invariant where asked
        logits = product.astype(jnp.float32) * self.head_scale.astype(jnp.float32)
        cap = self.logit_softcap
        return logits if cap is None else hn.tanh(logits / cap) * cap


def check_quantization(value: object, option: str = "EngineConfig.quantization") -> str:
    """``value`` if it is one of `QUANTIZATIONS`; otherwise a one-line `ValueError` naming ``option``."""
    if value not in QUANTIZATIONS:
        raise ValueError(f"{option} must be one of {', '.join(QUANTIZATIONS)}, got {value!r}")
    return str(value)


def quantized(model: CausalLM, quantization: str) -> CausalLM:
    """``model`` with its projections and output head in int8 for ``quantization="int8"`` (a model
    `quantized` already is returned as it is); ``model`` itself for ``"none"``. Runs as one compiled program,
    where the weights are."""
    if check_quantization(quantization) == "none" or isinstance(model, Int8HeadModel):
        return model
    return _quantize(model)


@eqx.filter_jit
def _quantize(model: CausalLM) -> CausalLM:
    return Int8HeadModel.wrap(_quantize_projections(model))


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
