"""The GRPO train step's loss: the policy's log-probabilities of the completion tokens, then `policy_loss`.

The log-probabilities are of the distribution the engine sampled from: the logits divided by
``rl.temperature`` and, with ``rl.top_p < 1``, truncated to the nucleus exactly as the engine's sampler
truncates them (`halyard.serve.filters.filtered_logits`, the one implementation of the filters), so the
importance ratios compare like with like. With ``rl.deterministic`` the forward pass is traced inside
`halyard.named.nn.batch_invariant`, as the engine's deterministic programs are: in a process without fused
multiply-adds (``train`` sees to it) the trainer's log-probabilities are the sampler's, bit for bit.

A batch (`halyard.train.rl.packing.layout_rows`) holds the rows: ``tokens`` ``[rows, width]`` (sequences
packed several to a row with their ``segment_ids`` and ``positions``, or one to a row), and per sequence
``[sequences, completion_tokens]``: where each completion token is predicted (``label_index``), the
``completion_mask``, the sampler's log-probabilities and, when needed, the old policy's and the reference's,
and the ``advantages``. The logits are computed at the completion tokens' label positions alone (not at the
prompts' or the padding's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from halyard.models.attention import AttentionMask
from halyard.models.model import default_positions
from halyard.named import named
from halyard.named.nn import batch_invariant, row_log_softmax
from halyard.serve.filters import FilterSettings, filtered_logits
from halyard.train.rl.config import RlConfig
from halyard.train.rl.losses import policy_loss
from halyard.train.step import split_microbatches

Batch = dict[str, jax.Array]


CHUNK_TOKENS = 1024
"""Token positions whose logits exist at once (the vocabulary is large: one chunk of 1,024 positions of a
152k vocabulary is 0.6 GB in float32, the whole batch's logits would be hundreds of GB)."""


def completion_logprobs(
    model: Any, rows: Batch, *, temperature: float, top_p: float, invariant: bool = False
) -> tuple[Float[Array, "sequences completion"], Float[Array, "sequences completion"]]:
    """Each completion token's log-probability and its position's entropy under the sampling distribution.

    The logits are computed at the completion tokens' label positions only, `CHUNK_TOKENS` at a time, and
    recomputed in the backward pass, so the memory they take does not grow with the batch.

    Args:
        model: a `halyard.models.CausalLM`.
        rows: ``tokens [rows, width]`` (position ``t`` predicts token ``t + 1``), with ``segment_ids`` and
            ``positions`` when packed, and ``label_index [sequences, completion]``.
        temperature: the sampling temperature.
        top_p: the sampling nucleus (1: none).
        invariant: trace the forward pass inside `halyard.named.nn.batch_invariant` (``rl.deterministic``).

    Returns:
        ``(logps, entropy)``, both float32 ``[sequences, completion]`` (padding slots hold what the position
        ``label_index`` names gives: the loss masks them).
    """
    with batch_invariant() if invariant else contextlib.nullcontext():
        return _completion_logprobs(model, rows, temperature, top_p)


def _completion_logprobs(
    model: Any, rows: Batch, temperature: float, top_p: float
) -> tuple[jax.Array, jax.Array]:
    computing = model.in_compute_dtype()
    tokens = rows["tokens"]
    inputs = named(tokens[:, :-1], ("batch", "pos"))
    if "segment_ids" in rows:  # packed: attention within a sequence, positions from its start
        segments = named(rows["segment_ids"][:, :-1], ("batch", "pos"))
        mask = model.complete_mask(AttentionMask(causal=True, segment_ids=segments))
        positions = named(rows["positions"][:, :-1], ("batch", "pos"))
    else:
        mask, positions = model.complete_mask(None), default_positions(inputs)
    hidden = computing.decoder(inputs, mask=mask, positions=positions).hidden
    plain = hidden.rearrange("batch", "pos", "embed").array
    plain = plain.reshape(plain.shape[0] * plain.shape[1], -1)
    index = rows["label_index"]
    sequences, completion = index.shape
    if "segment_ids" not in rows:  # padded: sequence s is row s, its labels counted within the row
        index = jnp.arange(sequences, dtype=index.dtype)[:, None] * (tokens.shape[1] - 1) + index
    count = sequences * completion
    states = plain[index.reshape(-1)]
    labels = tokens[:, 1:].reshape(-1)[index.reshape(-1)]
    chunk = min(CHUNK_TOKENS, count)
    padded = -(-count // chunk) * chunk
    states = jnp.pad(states, ((0, padded - count), (0, 0))).reshape(padded // chunk, chunk, -1)
    labels = jnp.pad(labels, (0, padded - count)).reshape(padded // chunk, chunk)

    @jax.checkpoint
    def one_chunk(pieces: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        states, targets = pieces
        logits = computing.logits(named(states, ("token", "embed"))).unwrap("token", "vocab")
        scaled = _sampling_logits(logits, temperature, top_p)
        log_probabilities = row_log_softmax(scaled)
        logps = jnp.take_along_axis(log_probabilities, targets[:, None], axis=-1)[:, 0]
        # with top_p < 1 a padding slot's token may lie outside the nucleus (-inf): 0 there, which the loss
        # masks out (a masked -inf would make the loss and its gradient NaN)
        logps = jnp.where(jnp.isfinite(logps), logps, 0.0)
        probabilities = jnp.exp(log_probabilities)
        entropy = -jnp.sum(jnp.where(probabilities > 0, probabilities * log_probabilities, 0.0), axis=-1)
        return logps, entropy

    logps, entropy = jax.lax.map(one_chunk, (states, labels))
    shape = (sequences, completion)
    return logps.reshape(-1)[:count].reshape(shape), entropy.reshape(-1)[:count].reshape(shape)


def _sampling_logits(logits: jax.Array, temperature: float, top_p: float) -> jax.Array:
    """``logits [tokens, vocab]`` as the engine samples from them: divided by the temperature and, with
    ``top_p < 1``, outside the nucleus at ``-inf`` (the engine's own filter)."""
    if top_p >= 1.0:
        return logits / temperature
    settings = FilterSettings.uniform(logits.shape[0], temperature=temperature, top_p=top_p)
    return filtered_logits(logits, settings)


def grpo_loss_fn(
    config: RlConfig,
) -> Callable[[Any, Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]:
    """``loss_fn(model, batch, key) -> (loss_sum, stats)`` for `halyard.train.step.make_train_step`.

    ``stats["num_tokens"]`` is the loss's normaliser (`policy_loss`), which the step divides by; every other
    stat is returned multiplied by it, so the step's division gives back `policy_loss`'s metrics, plus
    ``entropy`` (the mean over completion tokens) and ``logps/mean``.

    Args:
        config: the ``rl:`` section.
    """
    recipe = config.recipe

    def loss_fn(model: Any, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        del key  # the families have no dropout
        logps, entropy = completion_logprobs(
            model, batch, temperature=config.temperature, top_p=config.top_p, invariant=config.deterministic
        )
        mask = batch["completion_mask"].astype(jnp.float32)
        result = policy_loss(
            logps,
            batch.get("old_logps"),
            batch["sampler_logps"],
            batch["advantages"],
            mask,
            batch.get("reference_logps"),
            loss_type=recipe.normalizer,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            kl_beta=config.kl_beta,
            importance_sampling=config.importance_sampling,  # type: ignore[arg-type]
            importance_cap=config.importance_cap,
            level=recipe.level,
            max_completion_length=config.max_new_tokens,
        )
        counted = jnp.maximum(jnp.sum(mask), 1.0)
        stats = dict(result.metrics)
        stats["entropy"] = jnp.sum(jax.lax.stop_gradient(entropy) * mask) / counted
        stats["logps/mean"] = jnp.sum(jax.lax.stop_gradient(logps) * mask) / counted
        normalizer = jax.lax.stop_gradient(result.normalizer)
        stats = {name: value * normalizer for name, value in stats.items()}
        stats["num_tokens"] = normalizer
        return result.loss_sum, stats

    return loss_fn


def policy_logprobs(
    config: RlConfig, microbatches: int = 1
) -> Callable[[tuple[Any, ...], Batch], tuple[jax.Array, ...]]:
    """``(models, rows) -> one logps [sequences, completion] per model``, without gradients: the old policy's
    and the reference's log-probabilities of a rollout batch in one program (jit it), the rows prepared once
    for both, a microbatch at a time as the train step cuts them (``trainer.accumulation``: packed rows
    count their labels within their microbatch)."""

    def one_microbatch(models: tuple[Any, ...], rows: Batch) -> tuple[jax.Array, ...]:
        return tuple(
            completion_logprobs(
                jax.lax.stop_gradient(model),
                rows,
                temperature=config.temperature,
                top_p=config.top_p,
                invariant=config.deterministic,
            )[0]
            for model in models
        )

    def logprobs(models: tuple[Any, ...], rows: Batch) -> tuple[jax.Array, ...]:
        if microbatches == 1:
            return one_microbatch(models, rows)
        split = jax.lax.map(lambda part: one_microbatch(models, part), split_microbatches(rows, microbatches))
        # microbatch m's sequence j is the batch's sequence j * microbatches + m
        return tuple(jnp.swapaxes(value, 0, 1).reshape(-1, value.shape[-1]) for value in split)

    return logprobs
