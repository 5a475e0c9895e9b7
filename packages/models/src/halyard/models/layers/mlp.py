"""Feed-forward blocks: `MLP` (GPT-2: up, activation, down) and `GatedMLP` (Llama: SwiGLU)."""

from __future__ import annotations

from typing import Any, ClassVar, Self

import equinox as eqx
import jax

from halyard.named import Axis, NamedArray
from halyard.named.nn import DotGeneral, Linear, activation
from halyard.shard import constrain


class _FeedForward(eqx.Module):
    """What `MLP` and `GatedMLP` share: ``embed -> mlp`` input projections (`inputs`, in field order), then
    ``down: mlp -> embed``, and the activation name."""

    inputs: ClassVar[int]

    @classmethod
    def init(
        cls,
        Embed: Axis,
        Mlp: Axis,
        *,
        key: jax.Array,
        act: str,
        use_bias: bool,
        init_std: float,
        down_init_std: float,
        dtype: Any,
        dot_general: DotGeneral | None = None,
    ) -> Self:
        """Create the projections with N(0, std**2) weights and zero biases.

        Args:
            Embed, Mlp: model and hidden axes.
            key: PRNG key (split in field order: one key per projection).
            act: activation name (`halyard.named.nn.ACTIVATIONS`).
            use_bias: biases on every projection.
            init_std, down_init_std: weight std of the input projections and of ``down`` (residual projection).
            dtype: parameter dtype.
            dot_general: the projections' contraction (None: `Linear`'s default; `int8_dot_general` for
                int8 training).
        """
        activation(act)  # an unknown name is a ValueError listing the known ones
        *input_keys, down_key = jax.random.split(key, cls.inputs + 1)
        inputs = [
            Linear.init(
                Embed, Mlp, key=k, use_bias=use_bias, init_std=init_std, dtype=dtype, dot_general=dot_general
            )
            for k in input_keys
        ]
        down = Linear.init(
            Mlp, Embed, key=down_key, use_bias=use_bias, init_std=down_init_std, dtype=dtype,
            dot_general=dot_general,
        )  # fmt: skip
        return cls(*inputs, down, act)


class MLP(_FeedForward):
    """``down(act(up(x)))`` over ``embed -> mlp -> embed``, with biases (GPT-2's block MLP).

    Attributes:
        up: ``embed -> mlp``; down: ``mlp -> embed``; act: activation name (static).
    """

    inputs: ClassVar[int] = 1
    up: Linear
    down: Linear
    act: str = eqx.field(static=True)

    def __call__(self, x: NamedArray) -> NamedArray:
        """``x[..., embed] -> [..., embed]``."""
        hidden = constrain(activation(self.act)(self.up(x)))
        return self.down(hidden)


class GatedMLP(_FeedForward):
    """``down(act(gate(x)) * up(x))`` (SwiGLU with ``act="silu"``), Llama's MLP.

    Attributes:
        gate, up: ``embed -> mlp``; down: ``mlp -> embed``; act: activation name (static).
    """

    inputs: ClassVar[int] = 2
    gate: Linear
    up: Linear
    down: Linear
    act: str = eqx.field(static=True)

    def __call__(self, x: NamedArray) -> NamedArray:
        """``x[..., embed] -> [..., embed]``."""
        hidden = constrain(activation(self.act)(self.gate(x)) * self.up(x))
        return self.down(hidden)
