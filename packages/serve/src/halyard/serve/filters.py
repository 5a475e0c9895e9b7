"""Top-k, top-p and min-p: which of a row's tokens may be drawn, in transformers' order (temperature, top-k,
top-p, then min-p, each on the distribution the previous ones left).

Ranking a whole vocabulary is a sort, and XLA's CPU sort is slow (about 75 ms for 64 rows of 8,192 logits,
the rest of a decoding step about 30 ms). So the filters first rank only a row's `CANDIDATES` most likely
tokens (`jax.lax.top_k`, which ranks equal logits by index, as a stable sort does). That decides the row
when top-k keeps at most that many tokens, when the candidates already hold the top-p mass, or when the last
candidate falls below min-p: no token past the candidates can be kept then. Only a step with an undecided row
sorts the whole vocabulary, and only the undecided rows take that result, so a row is filtered alike
whatever else shares its step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from halyard.named.nn import row_sum

CANDIDATES = 256
"""The most likely tokens ranked first (fewer when the vocabulary is smaller)."""


class FilterSettings(NamedTuple):
    """Each row's filters (a `halyard.serve.sampler.RowSettings` has these fields too, and serves as well).

    Attributes:
        temperature: float32 ``[rows]``; 0 (greedy) divides by 1.
        top_k: int32 ``[rows]``; 0 keeps every token.
        top_p: float32 ``[rows]`` in (0, 1].
        min_p: float32 ``[rows]`` in [0, 1].
    """

    temperature: Any
    top_k: Any
    top_p: Any
    min_p: Any

    @classmethod
    def uniform(
        cls, rows: int, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
    ) -> FilterSettings:
        """The same filters for ``rows`` rows (a trainer's log-probabilities of one sampling setting)."""
        return cls(
            jnp.full((rows,), temperature, jnp.float32),
            jnp.full((rows,), top_k, jnp.int32),
            jnp.full((rows,), top_p, jnp.float32),
            jnp.full((rows,), min_p, jnp.float32),
        )


def filtered_logits(logits: jax.Array, settings: FilterSettings | Any) -> jax.Array:
    """``logits / temperature`` with the tokens outside top-k, top-p and min-p set to ``-inf``.

    Args:
        logits: float32 ``[rows, vocab]``.
        settings: the rows' `FilterSettings` (or `halyard.serve.sampler.RowSettings`).

    Returns:
        ``[rows, vocab]`` in vocabulary order; at least the most likely token survives in every row.
    """
    temperature = jnp.where(settings.temperature > 0, settings.temperature, 1.0)
    scaled = logits / temperature[:, None]
    vocab = scaled.shape[-1]
    top_k = jnp.where((settings.top_k > 0) & (settings.top_k < vocab), settings.top_k, vocab)
    unfiltered = (top_k == vocab) & (settings.top_p >= 1.0) & (settings.min_p <= 0.0)
    largest = jnp.max(scaled, axis=-1, keepdims=True)
    shift = jnp.where(jnp.isfinite(largest), largest, 0.0)
    everything = row_sum(jnp.exp(scaled - shift))

    def kept(count: int) -> tuple[jax.Array, jax.Array]:
        ranked, order = jax.lax.top_k(scaled, count)
        keep, decided = _kept(ranked, shift, top_k, jnp.where(top_k == vocab, everything, -1.0), settings)
        rows = jnp.arange(scaled.shape[0])[:, None]
        values = jnp.where(keep, ranked, -jnp.inf)
        in_order = jnp.full_like(scaled, -jnp.inf).at[rows, order].set(values, unique_indices=True)
        return jnp.where(unfiltered[:, None], scaled, in_order), decided | unfiltered

    filtered, decided = kept(min(CANDIDATES, vocab))
    if vocab <= CANDIDATES:
        return filtered
    return jax.lax.cond(
        jnp.all(decided),
        lambda: filtered,
        lambda: jnp.where(decided[:, None], filtered, kept(vocab)[0]),
    )


def _kept(
    ranked: jax.Array, shift: jax.Array, top_k: jax.Array, whole: jax.Array, settings: Any
) -> tuple[jax.Array, jax.Array]:
    """Which of a row's most likely tokens (``ranked``: ``[rows, count]``, descending) pass the filters, and
    whether that decides the row (no token past the ``count`` ranked ones can pass).

    Args:
        ranked: the scaled logits of the most likely tokens.
        shift: each row's largest scaled logit (0 when it is not finite), ``[rows, 1]``.
        top_k: each row's top-k (the vocabulary size for none).
        whole: each row's sum of ``exp(scaled - shift)`` over the whole vocabulary where top-k keeps all of
            it (the normaliser of its top-p), else negative.
        settings: the rows' settings.
    """
    count = ranked.shape[-1]
    rank = jnp.arange(count)[None, :]
    keep = rank < top_k[:, None]
    weights = jnp.exp(ranked - shift)
    total = jnp.where(whole >= 0, whole, row_sum(jnp.where(keep, weights, 0.0)))
    probabilities = weights / total[:, None]
    mass = jnp.cumsum(probabilities, axis=-1)
    top_p = settings.top_p[:, None]
    keep = keep & ((mass - probabilities < top_p) | (top_p >= 1.0))
    # min-p compares with the most likely token: renormalising rescales both alike
    floor = settings.min_p[:, None] * weights[:, :1]
    keep = (keep & (weights >= floor)) | (rank == 0)
    # the top-p mass is right when the normaliser is: top-k keeps only ranked tokens, or all of them
    normalised = (top_k <= count) | (whole >= 0)
    nucleus_ends = (settings.top_p < 1.0) & ~(mass[:, -1] < settings.top_p)
    below_min_p = weights[:, -1] < floor[:, 0]
    decided = (
        (top_k <= count)
        | (normalised & nucleus_ends)
        | ((normalised | (settings.top_p >= 1.0)) & below_min_p)
    )
    return keep, decided
