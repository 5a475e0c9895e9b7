"""`MoeMLP`: a top-k routed mixture of gated-MLP experts with dropless dispatch (Mixtral).

    p = softmax(x · W_router)                    # over experts
    (w, e) = top_k(p);  w = w / sum(w)           # renormalised over the chosen experts
    y = sum_j w_j * Expert_{e_j}(x)

Dispatch is dropless (no capacity, no token ever skipped): the ``tokens * top_k`` assignments are sorted
by expert, the experts' matmuls run on their contiguous groups with ``jax.lax.ragged_dot``, and the
weighted outputs are scattered back to their tokens. Ties in the router are broken towards the lower
expert index (``jax.lax.top_k``), so routing is deterministic.

The layer also returns `RouterStats`, summed over tokens, from which the model computes the
load-balancing loss of Switch Transformer / Mixtral (as in transformers' ``load_balancing_loss_func``:
``num_experts * sum_e f_e * P_e`` with ``f_e`` the share of assignments to expert ``e`` and ``P_e`` the
mean router probability, both over all layers' tokens) and ST-MoE's router z-loss
(mean of ``logsumexp(router_logits)**2``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.models.layers.activations import ACTIVATIONS, check_activation
from halyard.named import Axis, NamedArray
from halyard.named.nn import Linear
from halyard.shard import constrain

EXPERTS = "experts"


class RouterStats(NamedTuple):
    """Sums over the tokens of one layer (or, stacked, of every layer).

    Attributes:
        assignments: float ``[experts]`` number of (token, slot) assignments to each expert.
        probabilities: float ``[experts]`` sum of router probabilities per expert.
        tokens: number of tokens routed.
        z_loss: sum over tokens of ``logsumexp(router_logits)**2``.
    """

    assignments: jax.Array
    probabilities: jax.Array
    tokens: jax.Array
    z_loss: jax.Array


def load_balancing_loss(stats: RouterStats) -> jax.Array:
    """``num_experts * sum_e f_e * P_e`` over all tokens in ``stats`` (any leading axes are summed).

    Equals transformers' ``load_balancing_loss_func`` on the concatenated router logits of every layer.
    """
    assignments = stats.assignments.reshape(-1, stats.assignments.shape[-1]).sum(0)
    probabilities = stats.probabilities.reshape(-1, stats.probabilities.shape[-1]).sum(0)
    tokens = jnp.sum(stats.tokens)
    num_experts = assignments.shape[-1]
    return num_experts * jnp.sum((assignments / tokens) * (probabilities / tokens))


def router_z_loss(stats: RouterStats) -> jax.Array:
    """Mean over every routed token (of every layer) of ``logsumexp(router_logits)**2``."""
    return jnp.sum(stats.z_loss) / jnp.sum(stats.tokens)


class MoeMLP(eqx.Module):
    """Top-k routed gated-MLP experts.

    Attributes:
        router: ``embed -> experts`` (no bias).
        gate, up: expert weights ``(experts, embed, mlp)``; down: ``(experts, mlp, embed)``.
        top_k: experts per token (static); act: activation name (static).
    """

    router: Linear
    gate: NamedArray
    up: NamedArray
    down: NamedArray
    top_k: int = eqx.field(static=True)
    act: str = eqx.field(static=True)

    @classmethod
    def init(
        cls,
        Embed: Axis,
        Mlp: Axis,
        Experts: Axis,
        *,
        top_k: int,
        key: jax.Array,
        act: str,
        init_std: float,
        dtype: Any,
    ) -> MoeMLP:
        """Router and experts with N(0, init_std**2) weights.

        Raises:
            ValueError: ``top_k`` outside ``1 .. num_experts`` or an unknown activation.
        """
        if not 1 <= top_k <= Experts.size:
            raise ValueError(f"top_k={top_k} must lie between 1 and the number of experts ({Experts.size})")
        check_activation(act, "MoeMLP act")
        router_key, gate_key, up_key, down_key = jax.random.split(key, 4)
        router = Linear.init(Embed, Experts, key=router_key, use_bias=False, init_std=init_std, dtype=dtype)

        def weight(k: jax.Array, axes: tuple[Axis, ...]) -> NamedArray:
            return NamedArray(
                jax.random.normal(k, tuple(a.size for a in axes), jnp.float32).astype(dtype) * init_std, axes
            )

        gate = weight(gate_key, (Experts, Embed, Mlp))
        up = weight(up_key, (Experts, Embed, Mlp))
        down = weight(down_key, (Experts, Mlp, Embed))
        return cls(router, gate, up, down, top_k, act)

    def route(self, x: NamedArray) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Router logits, chosen experts and their weights for ``x[..., embed]`` flattened to tokens.

        Returns:
            ``(logits [tokens, experts] float32, experts [tokens, top_k] int32, weights [tokens, top_k])``.
        """
        logits = self.router(x).rearrange(..., EXPERTS)
        flat_logits = logits.array.reshape(-1, logits.array.shape[-1]).astype(jnp.float32)
        probabilities = jax.nn.softmax(flat_logits, axis=-1)
        top_probabilities, experts = jax.lax.top_k(probabilities, self.top_k)
        weights = top_probabilities / jnp.sum(top_probabilities, axis=-1, keepdims=True)
        return flat_logits, experts.astype(jnp.int32), weights

    def __call__(self, x: NamedArray) -> tuple[NamedArray, RouterStats]:
        """``x[..., embed] -> ([..., embed], router statistics of these tokens)``."""
        other = tuple(a for a in x.axes if a.name != "embed")
        ordered = x.rearrange(*[a.name for a in other], "embed")
        tokens = ordered.array.reshape(-1, ordered.array.shape[-1])
        logits, experts, weights = self.route(x)
        num_tokens, num_experts = logits.shape

        flat_experts = experts.reshape(-1)
        order = jnp.argsort(flat_experts, stable=True)  # assignments grouped by expert
        token_of = order // self.top_k
        group_sizes = jnp.bincount(flat_experts, length=num_experts).astype(jnp.int32)
        grouped = tokens[token_of]
        gate_w = self.gate.unwrap(EXPERTS, "embed", "mlp").astype(tokens.dtype)
        up_w = self.up.unwrap(EXPERTS, "embed", "mlp").astype(tokens.dtype)
        down_w = self.down.unwrap(EXPERTS, "mlp", "embed").astype(tokens.dtype)
        hidden = ACTIVATIONS[self.act](jax.lax.ragged_dot(grouped, gate_w, group_sizes)) * jax.lax.ragged_dot(
            grouped, up_w, group_sizes
        )
        expert_out = jax.lax.ragged_dot(hidden, down_w, group_sizes)
        weighted = expert_out * weights.reshape(-1)[order][:, None].astype(expert_out.dtype)
        combined = jnp.zeros_like(tokens).at[token_of].add(weighted)

        y = NamedArray(combined.reshape(ordered.array.shape), ordered.axes).rearrange(*x.axis_names)
        probabilities = jax.nn.softmax(logits, axis=-1)
        stats = RouterStats(
            assignments=group_sizes.astype(jnp.float32),
            probabilities=jnp.sum(probabilities, axis=0),
            tokens=jnp.asarray(num_tokens, jnp.float32),
            z_loss=jnp.sum(jnp.square(jax.nn.logsumexp(logits, axis=-1))),
        )
        return constrain(y), stats
