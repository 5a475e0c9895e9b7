"""Next-token cross-entropy computed in vocabulary blocks, so ``[tokens, vocab]`` logits never exist.

The core is one custom-VJP function: for every token it returns the log-sum-exp of its logits and the
logit of its label, scanning over blocks of the unembedding with an online log-sum-exp. Its backward
pass scans the blocks again, recomputing each block's softmax from the saved log-sum-exp. Everything
else (cross-entropy, z-loss, masking, reduction) is ordinary differentiable code on top of those two
per-token numbers, so both paths (blocked and full logits) share it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from halyard.models.attention.softcap import checked_softcap, soft_cap, soft_cap_derivative
from halyard.named import NamedArray
from halyard.named.nn import default_dot_general

REDUCTIONS = ("mean", "sum", "none")


def next_token_loss(
    hidden: NamedArray,
    unembed: NamedArray,
    labels: NamedArray,
    *,
    loss_mask: NamedArray | None = None,
    block_size: int | None = 2048,
    full_logits_max_bytes: int = 0,
    z_loss_weight: float = 0.0,
    logit_scale: float = 1.0,
    logit_softcap: float | None = None,
    reduction: str = "mean",
) -> tuple[NamedArray, dict[str, NamedArray]]:
    """Cross-entropy of ``labels`` under ``softmax(softcap(logit_scale * hidden . unembed))``, plus z-loss.

    Args:
        hidden: ``(batch..., "pos", "embed")``, the final-norm output.
        unembed: ``("vocab", "embed")`` output embedding (any axis order).
        labels: int ``(batch..., "pos")``: the target token of each position (already shifted: position
            ``t`` predicts token ``t + 1``). Labels outside ``[0, vocab)`` must be masked out.
        loss_mask: ``(batch..., "pos")`` bool or float weights; positions with 0 do not count. Missing
            batch axes broadcast. Default: every position counts.
        block_size: vocabulary entries per block; None computes the full logits (for tests and small
            vocabularies). A vocabulary that is not a multiple is handled.
        full_logits_max_bytes: compute the full logits anyway when their float32 ``[tokens, vocab]`` matrix
            takes at most this many bytes (blocking only saves memory, and recomputing the blocks in the
            backward pass costs a third more of the output projection's FLOPs); 0 always blocks.
        z_loss_weight: weight of the z-loss ``logsumexp(logits)**2`` (PaLM), added to the loss.
        logit_scale: multiplier on the logits (muP's output multiplier).
        logit_softcap: ``cap``: the scaled logits become ``cap * tanh(logits / cap)`` before the
            cross-entropy and the z-loss (Gemma 2's ``final_logit_softcapping``); None: no capping.
        reduction: ``mean`` (over counted tokens, weighted), ``sum``, or ``none`` (per position).

    Returns:
        ``(loss, metrics)``: ``loss`` is a scalar NamedArray (or ``(batch..., "pos")`` for ``none``);
        ``metrics`` has ``cross_entropy`` and ``z_loss`` (unweighted ``lse**2``) reduced the same way,
        and ``num_tokens`` (sum of the mask weights, a scalar).

    Raises:
        ValueError: missing axes, sizes that disagree, an unknown reduction, a bad block size or a
            ``logit_softcap`` that is not a positive number.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"next_token_loss: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
        raise ValueError(f"next_token_loss: block_size must be a positive int or None, got {block_size!r}")
    logit_softcap = checked_softcap(logit_softcap, "next_token_loss")
    for name, array, needed in (
        ("hidden", hidden, ("pos", "embed")),
        ("unembed", unembed, ("vocab", "embed")),
        ("labels", labels, ("pos",)),
    ):
        missing = [axis for axis in needed if not array.has_axis(axis)]
        if missing:
            raise ValueError(f"next_token_loss: {name} has axes {array.axis_names} but lacks {missing}")
    if set(unembed.axis_names) != {"vocab", "embed"}:
        raise ValueError(
            f"next_token_loss: unembed must have exactly ('vocab', 'embed'), got {unembed.axis_names}"
        )
    if unembed.axis_size("embed") != hidden.axis_size("embed"):
        raise ValueError(
            f"next_token_loss: hidden has embed={hidden.axis_size('embed')} but unembed has "
            f"embed={unembed.axis_size('embed')}"
        )
    token_axes = tuple(a for a in hidden.axes if a.name != "embed")
    token_names = [a.name for a in token_axes]
    if sorted(labels.axis_names) != sorted(token_names) or any(
        labels.axis_size(a.name) != a.size for a in token_axes
    ):
        raise ValueError(
            f"next_token_loss: labels have axes {labels.axes} but hidden's token axes are {token_axes}"
        )
    num_tokens_flat = math.prod(a.size for a in token_axes)
    hidden_flat = hidden.rearrange(*token_names, "embed").array.reshape(num_tokens_flat, -1)
    label_flat = labels.rearrange(*token_names).array.reshape(num_tokens_flat).astype(jnp.int32)
    weights = jnp.ones((num_tokens_flat,), jnp.float32)
    if loss_mask is not None:
        extra = [name for name in loss_mask.axis_names if name not in token_names]
        if extra:
            raise ValueError(f"next_token_loss: loss_mask has axes {extra} that hidden lacks ({token_names})")
        from halyard.named import broadcast_to

        weights = broadcast_to(loss_mask, token_axes).array.reshape(num_tokens_flat).astype(jnp.float32)
    weight_matrix = unembed.rearrange("vocab", "embed").array
    vocab_size = weight_matrix.shape[0]
    if block_size is None or num_tokens_flat * vocab_size * 4 <= full_logits_max_bytes:
        log_sum_exp, label_logit = _full_logsumexp_and_label_logit(
            hidden_flat, weight_matrix, label_flat, logit_scale, logit_softcap
        )
    else:
        static = _Static(float(logit_scale), int(block_size), logit_softcap)
        log_sum_exp, label_logit = _blocked_logsumexp_and_label_logit(
            static, hidden_flat, weight_matrix, label_flat
        )
    cross_entropy = log_sum_exp - label_logit
    z_loss = jnp.square(log_sum_exp)
    per_token = cross_entropy + z_loss_weight * z_loss
    num_tokens = weights.sum()

    def reduce(values: jax.Array) -> NamedArray:
        if reduction == "none":
            return NamedArray((values * weights).reshape(tuple(a.size for a in token_axes)), token_axes)
        total = jnp.sum(values * weights)
        if reduction == "mean":
            total = total / jnp.maximum(num_tokens, 1e-9)
        return NamedArray(total, ())

    metrics = {
        "cross_entropy": reduce(cross_entropy),
        "z_loss": reduce(z_loss),
        "num_tokens": NamedArray(num_tokens, ()),
    }
    return reduce(per_token), metrics


def _label_logit_of(logits: jax.Array, labels: jax.Array, offset: int | jax.Array) -> jax.Array:
    """The logit of each token's label if it falls in this block of columns (else 0)."""
    local = labels - offset
    inside = (local >= 0) & (local < logits.shape[-1])
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, logits.shape[-1] - 1)[:, None], axis=-1)[:, 0]
    return jnp.where(inside, picked, 0.0)


def _full_logsumexp_and_label_logit(
    hidden: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    logit_scale: float,
    logit_softcap: float | None,
) -> tuple[jax.Array, jax.Array]:
    # hidden [n, embed] x weight [vocab, embed] -> [n, vocab] (row-major gradient products on CPU).
    contract = (((1,), (1,)), ((), ()))
    logits = default_dot_general(hidden, weight, contract, preferred_element_type=jnp.float32) * logit_scale
    if logit_softcap is not None:
        logits = soft_cap(logits, logit_softcap)
    return jax.nn.logsumexp(logits, axis=-1), _label_logit_of(logits, labels, 0)


def _vocab_blocks(weight: jax.Array, block_size: int) -> jax.Array:
    """``[vocab, embed]`` -> ``[num_blocks, block, embed]``, zero-padded (padded columns are masked)."""
    vocab = weight.shape[0]
    block = min(block_size, vocab)
    padded = -(-vocab // block) * block
    weight = jnp.pad(weight, ((0, padded - vocab), (0, 0)))
    return weight.reshape(padded // block, block, weight.shape[1])


def _scan_blocks(
    step: Callable[[Any, jax.Array], tuple[Any, Any]], initial: Any, length: int
) -> tuple[Any, Any]:
    """``lax.scan`` over vocabulary blocks; a vocabulary in one block runs inline (quicker to compile)."""
    if length == 1:
        carry, output = step(initial, jnp.asarray(0))
        return carry, jax.tree.map(lambda leaf: leaf[None], output)
    return jax.lax.scan(step, initial, jnp.arange(length))


class _Static(NamedTuple):
    """Trace-time settings of the blocked loss; ``logit_softcap`` is None for uncapped logits."""

    scale: float
    block_size: int
    logit_softcap: float | None


def _block_logits(static: _Static, hidden: jax.Array, weight_block: jax.Array) -> jax.Array:
    """``[n, embed] x [block, embed] -> [n, block]`` in float32, scaled and soft-capped (padding included)."""
    logits = jnp.einsum("ne,ve->nv", hidden, weight_block, preferred_element_type=jnp.float32) * static.scale
    if static.logit_softcap is not None:
        logits = soft_cap(logits, static.logit_softcap)
    return logits


def _hide_padding(logits: jax.Array, index: jax.Array, vocab: int) -> jax.Array:
    """``-inf`` in the columns of block ``index`` past the vocabulary (the zero-padded rows)."""
    block = logits.shape[-1]
    column = index * block + jnp.arange(block)
    return jnp.where(column[None, :] < vocab, logits, -jnp.inf)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blocked_logsumexp_and_label_logit(
    static: _Static, hidden: jax.Array, weight: jax.Array, labels: jax.Array
) -> tuple[jax.Array, jax.Array]:
    blocks = _vocab_blocks(weight, static.block_size)
    vocab, block = weight.shape[0], blocks.shape[1]
    num_tokens = hidden.shape[0]

    def step(carry: tuple, index: jax.Array) -> tuple[tuple, None]:
        running_max, running_sum, label_logit = carry
        logits = _hide_padding(_block_logits(static, hidden, blocks[index]), index, vocab)
        new_max = jnp.maximum(running_max, logits.max(axis=-1))
        running_sum = running_sum * jnp.exp(running_max - new_max) + jnp.exp(logits - new_max[:, None]).sum(
            -1
        )
        label_logit = label_logit + _label_logit_of(logits, labels, index * block)
        return (new_max, running_sum, label_logit), None

    initial = (
        jnp.full((num_tokens,), -jnp.inf, jnp.float32),
        jnp.zeros((num_tokens,), jnp.float32),
        jnp.zeros((num_tokens,), jnp.float32),
    )
    (running_max, running_sum, label_logit), _ = _scan_blocks(step, initial, blocks.shape[0])
    return running_max + jnp.log(running_sum), label_logit


def _blocked_forward(
    static: _Static, hidden: jax.Array, weight: jax.Array, labels: jax.Array
) -> tuple[tuple[jax.Array, jax.Array], tuple]:
    log_sum_exp, label_logit = _blocked_logsumexp_and_label_logit(static, hidden, weight, labels)
    return (log_sum_exp, label_logit), (hidden, weight, labels, log_sum_exp)


def _blocked_backward(static: _Static, residuals: tuple, cotangents: tuple) -> tuple:
    hidden, weight, labels, log_sum_exp = residuals
    log_sum_exp_cotangent, label_logit_cotangent = cotangents
    blocks = _vocab_blocks(weight, static.block_size)
    vocab, block = weight.shape[0], blocks.shape[1]

    def step(hidden_gradient: jax.Array, index: jax.Array) -> tuple[jax.Array, jax.Array]:
        weight_block = blocks[index]
        logits = _block_logits(static, hidden, weight_block)
        # d lse / d logit = softmax; d label_logit / d logit = one-hot of the label.
        probabilities = jnp.exp(_hide_padding(logits, index, vocab) - log_sum_exp[:, None])
        local = labels - index * block
        one_hot = (local[:, None] == jnp.arange(block)[None, :]).astype(jnp.float32)
        logit_gradient = (
            log_sum_exp_cotangent[:, None] * probabilities + label_logit_cotangent[:, None] * one_hot
        ) * static.scale
        if static.logit_softcap is not None:
            # The padded columns' logits are finite (zero rows), so this stays finite there.
            logit_gradient = logit_gradient * soft_cap_derivative(logits, static.logit_softcap)
        hidden_gradient = hidden_gradient + jnp.einsum(
            "nv,ve->ne", logit_gradient, weight_block.astype(jnp.float32)
        )
        weight_gradient = jnp.einsum("nv,ne->ve", logit_gradient, hidden.astype(jnp.float32))
        # Blocks are disjoint rows: rounding each to the weight's dtype here is the final rounding, and the
        # stacked gradients take the weight's bytes (half of float32's for bfloat16) rather than float32's.
        return hidden_gradient, weight_gradient.astype(weight.dtype)

    hidden_gradient, weight_gradients = _scan_blocks(
        step, jnp.zeros(hidden.shape, jnp.float32), blocks.shape[0]
    )
    weight_gradient = weight_gradients.reshape(-1, weight.shape[1])[:vocab]
    return hidden_gradient.astype(hidden.dtype), weight_gradient, None


_blocked_logsumexp_and_label_logit.defvjp(_blocked_forward, _blocked_backward)
