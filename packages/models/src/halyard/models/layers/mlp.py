"""Feed-forward blocks: `MLP` (GPT-2: up, activation, down) and `GatedMLP` (Llama: SwiGLU)."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax

from halyard.named import Axis, NamedArray
from halyard.named.nn import Linear, activation
from halyard.shard import constrain


class MLP(eqx.Module):
    """``down(act(up(x)))`` over ``embed -> mlp -> embed``, with biases (GPT-2's block MLP).

    Attributes:
        up: ``embed -> mlp``; down: ``mlp -> embed``; act: activation name (static).
    """

    up: Linear
    down: Linear
    act: str = eqx.field(static=True)

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
    ) -> MLP:
        """Create the two projections with N(0, std**2) weights and zero biases.

        Args:
            Embed, Mlp: model and hidden axes.
            key: PRNG key.
            act: activation name (see `halyard.models.layers.activations`).
            use_bias: biases on both projections.
            init_std, down_init_std: weight std of ``up`` and of ``down`` (residual projection).
            dtype: parameter dtype.
        """
        activation(act)  # an unknown name is a ValueError listing the known ones
        up_key, down_key = jax.random.split(key)
        up = Linear.init(Embed, Mlp, key=up_key, use_bias=use_bias, init_std=init_std, dtype=dtype)
        down = Linear.init(Mlp, Embed, key=down_key, use_bias=use_bias, init_std=down_init_std, dtype=dtype)
        return cls(up, down, act)

    def __call__(self, x: NamedArray) -> NamedArray:
        """``x[..., embed] -> [..., embed]``."""
        hidden = constrain(activation(self.act)(self.up(x)))
        return self.down(hidden)


class GatedMLP(eqx.Module):
    """``down(act(gate(x)) * up(x))`` (SwiGLU with ``act="silu"``), Llama's MLP.

    Attributes:
        gate, up: ``embed -> mlp``; down: ``mlp -> embed``; act: activation name (static).
    """

    gate: Linear
    up: Linear
    down: Linear
    act: str = eqx.field(static=True)

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
    ) -> GatedMLP:
        """Create the three projections (arguments as in `MLP.init`)."""
        activation(act)
        gate_key, up_key, down_key = jax.random.split(key, 3)
        gate = Linear.init(Embed, Mlp, key=gate_key, use_bias=use_bias, init_std=init_std, dtype=dtype)
        up = Linear.init(Embed, Mlp, key=up_key, use_bias=use_bias, init_std=init_std, dtype=dtype)
        down = Linear.init(Mlp, Embed, key=down_key, use_bias=use_bias, init_std=down_init_std, dtype=dtype)
        return cls(gate, up, down, act)

    def __call__(self, x: NamedArray) -> NamedArray:
        """``x[..., embed] -> [..., embed]``."""
        hidden = constrain(activation(self.act)(self.gate(x)) * self.up(x))
        return self.down(hidden)
