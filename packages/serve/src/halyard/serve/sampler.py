"""Choosing each row's next token inside the compiled step, every row with its own settings and key.

A row's token depends on its logits, its settings and its key only: the key is derived from the request's
seed, the sample's index and the token's position (`row_keys`), never from the batch, so a request draws
the same tokens whatever else runs beside it, and a preempted sequence redraws the same tokens when it is
recomputed. The filters follow transformers' order: temperature, top-k, top-p, then min-p, each on the
distribution the previous ones left.

Two log-probabilities come back per token: ``logprob``, under the model's distribution (what OpenAI's API
reports; temperature 1, nothing filtered), and ``sampled_logprob``, under the distribution the token was
actually drawn from (temperature and filters applied; 0 for a greedy row). Reinforcement learning needs
the second to compute importance ratios for the distribution it sampled.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from halyard.named.nn import row_log_softmax, row_softmax


class RowSettings(NamedTuple):  # numpy arrays on the host, jax arrays inside the program
    """Per-row sampling settings, one entry per row.

    Attributes:
        temperature: float32; 0 is greedy.
        top_k: int32; 0 keeps every token.
        top_p: float32 in (0, 1].
        min_p: float32 in [0, 1].
        seed: uint32 ``[rows, 2]``: the request seed's high and low 32 bits.
        sample: int32: the sample's index within its request.
        position: int32: the position of the token being drawn.
    """

    temperature: Any
    top_k: Any
    top_p: Any
    min_p: Any
    seed: Any
    sample: Any
    position: Any


class Drawn(NamedTuple):
    """What `draw` returns per row: the token, its two log-probabilities and the top alternatives."""

    token: jax.Array
    logprob: jax.Array
    sampled_logprob: jax.Array
    top_tokens: jax.Array
    top_logprobs: jax.Array


def row_keys(settings: RowSettings) -> jax.Array:
    """One PRNG key per row from (seed, sample, position) alone."""

    def one(seed: jax.Array, sample: jax.Array, position: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), seed[0]), seed[1])
        return jax.random.fold_in(jax.random.fold_in(key, sample), position)

    return jax.vmap(one)(
        settings.seed, settings.sample.astype(jnp.uint32), settings.position.astype(jnp.uint32)
    )


def filtered_logits(logits: jax.Array, settings: RowSettings) -> jax.Array:
    """``logits / temperature`` with the tokens outside top-k, top-p and min-p set to ``-inf``.

    Args:
        logits: float32 ``[rows, vocab]``.
        settings: the rows' settings (greedy rows are divided by 1).

    Returns:
        ``[rows, vocab]`` in vocabulary order; at least the most likely token survives in every row.
    """
    temperature = jnp.where(settings.temperature > 0, settings.temperature, 1.0)
    scaled = logits / temperature[:, None]
    vocab = scaled.shape[-1]
    order = jnp.argsort(-scaled, axis=-1, stable=True)
    ranked = jnp.take_along_axis(scaled, order, axis=-1)
    rank = jnp.arange(vocab)[None, :]
    top_k = jnp.where(settings.top_k > 0, settings.top_k, vocab)
    keep = rank < top_k[:, None]
    probabilities = row_softmax(jnp.where(keep, ranked, -jnp.inf))
    mass_before = jnp.cumsum(probabilities, axis=-1) - probabilities
    keep = keep & ((mass_before < settings.top_p[:, None]) | (settings.top_p[:, None] >= 1.0))
    probabilities = row_softmax(jnp.where(keep, ranked, -jnp.inf))
    keep = keep & (probabilities >= settings.min_p[:, None] * probabilities[:, :1])
    keep = keep | (rank == 0)
    kept_ranked = jnp.where(keep, ranked, -jnp.inf)
    inverse = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(kept_ranked, inverse, axis=-1)


def draw(logits: jax.Array, settings: RowSettings, num_top: int) -> Drawn:
    """Each row's next token (see the module docstring).

    Args:
        logits: float32 ``[rows, vocab]``.
        settings: per-row settings.
        num_top: alternatives returned per row (the most likely tokens under the model's distribution).
    """
    logprobs = row_log_softmax(logits)
    needs_filter = jnp.any((settings.top_k > 0) | (settings.top_p < 1.0) | (settings.min_p > 0.0))
    temperature = jnp.where(settings.temperature > 0, settings.temperature, 1.0)
    filtered = jax.lax.cond(
        needs_filter,
        lambda: filtered_logits(logits, settings),
        lambda: logits / temperature[:, None],
    )
    gumbel = jax.vmap(lambda key: jax.random.gumbel(key, (logits.shape[-1],), jnp.float32))(
        row_keys(settings)
    )
    sampled = jnp.argmax(filtered + gumbel, axis=-1)
    greedy = jnp.argmax(logits, axis=-1)
    token = jnp.where(settings.temperature > 0, sampled, greedy).astype(jnp.int32)
    sampled_logprobs = row_log_softmax(filtered)
    rows = jnp.arange(logits.shape[0])
    sampled_logprob = jnp.where(settings.temperature > 0, sampled_logprobs[rows, token], 0.0)
    top_logprobs, top_tokens = jax.lax.top_k(logprobs, num_top)
    return Drawn(token, logprobs[rows, token], sampled_logprob, top_tokens.astype(jnp.int32), top_logprobs)
