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
(mean of ``logsumexp(router_logits)**2``). Given a ``token_mask``, the sums run over the real tokens
only: padding and loss-masked positions are still routed (dispatch is dropless) but neither pull the
balance towards the experts they happen to choose nor count in the means (like transformers'
``load_balancing_loss_func`` with an ``attention_mask``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.named import Axis, NamedArray, collecting_reports, report
from halyard.named.nn import Linear, activation
from halyard.shard import constrain

EXPERTS = "experts"


class RouterStats(NamedTuple):
    """Sums over the tokens of one layer (or, stacked, of every layer).

    Attributes:
        assignments: float ``[experts]`` number of (token, slot) assignments to each expert.
        probabilities: float ``[experts]`` sum of router probabilities per expert.
        tokens: number of tokens counted (all routed tokens, or the sum of the token mask).
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
    tokens = _at_least_one(jnp.sum(stats.tokens))
    num_experts = assignments.shape[-1]
    return num_experts * jnp.sum((assignments / tokens) * (probabilities / tokens))


def router_z_loss(stats: RouterStats) -> jax.Array:
    """Mean over every counted token (of every layer) of ``logsumexp(router_logits)**2``."""
    return jnp.sum(stats.z_loss) / _at_least_one(jnp.sum(stats.tokens))


def _report_router(stats: RouterStats) -> None:
    """What a step collecting the model's reports gets from this layer (`halyard.models.reports`)."""
    if not collecting_reports():
        return
    report("moe/tokens_per_expert", stats.assignments, reduce="sum")
    report("moe/dropped_tokens", 0.0, reduce="sum")  # dropless dispatch: no token is ever skipped
    report("moe/load_balancing_loss", load_balancing_loss(stats))
    report("moe/router_z_loss", router_z_loss(stats))


def _at_least_one(tokens: jax.Array) -> jax.Array:
    # A batch whose tokens are all masked has zero sums: its losses are 0, not 0/0.
    return jnp.where(tokens > 0, tokens, 1.0)


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
        activation(act)  # an unknown name is a ValueError listing the known ones
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

    def __call__(self, x: NamedArray, token_mask: NamedArray | None = None) -> tuple[NamedArray, RouterStats]:
        """``x[..., embed] -> ([..., embed], router statistics of these tokens)``.

        Args:
            x: hidden states with an ``embed`` axis; every other axis is a token axis.
            token_mask: 0/1 weight of each token in the router statistics, with ``x``'s axes except
                ``embed`` (e.g. the batch's loss mask over ``batch, pos``); None counts every token.
                The layer's output does not depend on it.

        Raises:
            ValueError: when ``token_mask`` has other axes than ``x`` without ``embed``.
        """
        other = tuple(a for a in x.axes if a.name != "embed")
        ordered = x.rearrange(*[a.name for a in other], "embed")
        tokens = ordered.array.reshape(-1, ordered.array.shape[-1])
        weight = self._token_weights(token_mask, other)
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
        gated = jax.lax.ragged_dot(grouped, gate_w, group_sizes)
        routed_axes = (Axis("routed", gated.shape[0]), Axis("mlp", gated.shape[1]))
        hidden = activation(self.act)(NamedArray(gated, routed_axes)).array * jax.lax.ragged_dot(
            grouped, up_w, group_sizes
        )
        expert_out = jax.lax.ragged_dot(hidden, down_w, group_sizes)
        weighted = expert_out * weights.reshape(-1)[order][:, None].astype(expert_out.dtype)
        combined = jnp.zeros_like(tokens).at[token_of].add(weighted)

        y = NamedArray(combined.reshape(ordered.array.shape), ordered.axes).rearrange(*x.axis_names)
        probabilities = jax.nn.softmax(logits, axis=-1)
        if weight is None:
            stats = RouterStats(
                assignments=group_sizes.astype(jnp.float32),
                probabilities=jnp.sum(probabilities, axis=0),
                tokens=jnp.asarray(num_tokens, jnp.float32),
                z_loss=jnp.sum(jnp.square(jax.nn.logsumexp(logits, axis=-1))),
            )
        else:
            stats = RouterStats(
                assignments=jnp.zeros(num_experts, jnp.float32)
                .at[flat_experts]
                .add(jnp.repeat(weight, self.top_k)),
                probabilities=jnp.sum(probabilities * weight[:, None], axis=0),
                tokens=jnp.sum(weight),
                z_loss=jnp.sum(jnp.square(jax.nn.logsumexp(logits, axis=-1)) * weight),
            )
        _report_router(stats)
        return constrain(y), stats

    @staticmethod
    def _token_weights(token_mask: NamedArray | None, token_axes: tuple[Axis, ...]) -> jax.Array | None:
        """``token_mask`` as float32 ``[tokens]`` in the order of ``token_axes`` (None stays None)."""
        if token_mask is None:
            return None
        if {a.name: a.size for a in token_mask.axes} != {a.name: a.size for a in token_axes}:
            raise ValueError(
                f"MoeMLP token_mask has axes {token_mask.shape}, expected the token axes of x "
                f"{dict((a.name, a.size) for a in token_axes)} (x's axes without embed)"
            )
        ordered = token_mask.rearrange(*[a.name for a in token_axes])
        return jax.lax.stop_gradient(ordered.array.reshape(-1).astype(jnp.float32))
