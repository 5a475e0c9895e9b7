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

from halyard.named.nn import row_log_softmax
from halyard.serve.filters import filtered_logits


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


class LogitAdjustments(NamedTuple):  # numpy arrays on the host, jax arrays inside the program
    """Per-row changes to the logits before the draw: a grammar's mask and ``logit_bias``
    (`halyard.serve.grammar`). A row without either allows every token and biases none, and draws as it
    would in a program without adjustments.

    Attributes:
        allowed: int32 ``[rows, words]``: bit ``t % 32`` of word ``t // 32`` set where token ``t`` may be drawn.
        bias_tokens: int32 ``[rows, MAX_LOGIT_BIAS]``: the biased token ids, the vocabulary size where unused.
        bias_values: float32 ``[rows, MAX_LOGIT_BIAS]``: what is added to their logits.
    """

    allowed: Any
    bias_tokens: Any
    bias_values: Any


def adjusted_logits(logits: jax.Array, adjustments: LogitAdjustments) -> jax.Array:
    """``logits`` (float32 ``[rows, vocab]``) with the tokens a row's mask leaves out at ``-inf`` and its
    biases added; entries neither touches keep their bits."""
    rows, vocab = logits.shape
    bits = jnp.arange(32, dtype=jnp.int32)
    allowed = (adjustments.allowed[:, :, None] >> bits) & 1  # [rows, words, 32]
    allowed = allowed.reshape(rows, -1)[:, :vocab]
    masked = jnp.where(allowed != 0, logits, -jnp.inf)
    row = jnp.arange(rows)[:, None]
    return masked.at[row, adjustments.bias_tokens].add(adjustments.bias_values, mode="drop")


def repeated_rows(
    settings: RowSettings, adjustments: LogitAdjustments | None, last: jax.Array, draws: int, tokens: int
) -> tuple[RowSettings, LogitAdjustments | None, jax.Array]:
    """Each row ``draws`` times over, the copies drawing at the row's next positions: after flat indices
    ``last + j`` (at most ``tokens - 1``), at ``position + j``, keyed as a row drawing there alone would be
    (`row_keys`), so a speculative row's draws are the ones it would make a token at a time."""
    offsets = jnp.tile(jnp.arange(draws, dtype=jnp.int32), last.shape[0])
    settings = RowSettings(*(jnp.repeat(field, draws, axis=0) for field in settings))
    settings = settings._replace(position=settings.position + offsets)
    if adjustments is not None:
        adjustments = LogitAdjustments(*(jnp.repeat(field, draws, axis=0) for field in adjustments))
    return settings, adjustments, jnp.minimum(jnp.repeat(last, draws) + offsets, tokens - 1)


class Drawn(NamedTuple):
    """What `draw` returns per row: the token, its two log-probabilities and the top alternatives (None
    when none were asked for)."""

    token: jax.Array
    logprob: jax.Array
    sampled_logprob: jax.Array
    top_tokens: jax.Array | None
    top_logprobs: jax.Array | None


def row_keys(settings: RowSettings) -> jax.Array:
    """One PRNG key per row from (seed, sample, position) alone."""

    def one(seed: jax.Array, sample: jax.Array, position: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), seed[0]), seed[1])
        return jax.random.fold_in(jax.random.fold_in(key, sample), position)

    return jax.vmap(one)(
        settings.seed, settings.sample.astype(jnp.uint32), settings.position.astype(jnp.uint32)
    )


def first_argmax(x: jax.Array) -> jax.Array:
    """``jnp.argmax(x, axis=-1)`` (the first largest entry, or the first NaN), as two plain reductions: XLA's
    CPU argmax, a reduction over (value, index) pairs, takes several times as long over a vocabulary."""
    largest = jnp.max(x, axis=-1, keepdims=True)
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where((x == largest) | jnp.isnan(x), index, x.shape[-1]), axis=-1)


def draw(
    logits: jax.Array, settings: RowSettings, num_top: int, adjustments: LogitAdjustments | None = None
) -> Drawn:
    """Each row's next token (see the module docstring).

    A step whose rows are all greedy skips what only sampling needs (the filters, the Gumbel noise); no
    row's numbers depend on whether the others sample.

    Args:
        logits: float32 ``[rows, vocab]``.
        settings: per-row settings.
        num_top: alternatives returned per row (the most likely tokens under the model's distribution);
            0 for none.
        adjustments: masks and biases applied before the filters (None: none); ``logprob`` and the
            alternatives stay the model's.
    """
    logprobs = row_log_softmax(logits)
    if adjustments is not None:
        logits = adjusted_logits(logits, adjustments)
    greedy = first_argmax(logits)
    rows = jnp.arange(logits.shape[0])

    def sample() -> tuple[jax.Array, jax.Array]:
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
        token = jnp.where(settings.temperature > 0, first_argmax(filtered + gumbel), greedy)
        sampled_logprob = jnp.where(settings.temperature > 0, row_log_softmax(filtered)[rows, token], 0.0)
        return token, sampled_logprob

    def all_greedy() -> tuple[jax.Array, jax.Array]:
        return greedy, jnp.zeros(logits.shape[:1], jnp.float32)

    token, sampled_logprob = jax.lax.cond(jnp.any(settings.temperature > 0), sample, all_greedy)
    token = token.astype(jnp.int32)
    if not num_top:
        return Drawn(token, logprobs[rows, token], sampled_logprob, None, None)
    top_logprobs, top_tokens = jax.lax.top_k(logprobs, num_top)
    return Drawn(token, logprobs[rows, token], sampled_logprob, top_tokens.astype(jnp.int32), top_logprobs)
