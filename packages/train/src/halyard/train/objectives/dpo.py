"""Direct preference optimisation (Rafailov et al. 2023): the loss on summed reply log-probabilities.

For a pair with chosen reply ``c`` and rejected reply ``r`` after the same prompt, with ``pi`` the model's
and ``ref`` the frozen reference model's summed log-probabilities of the reply tokens,

    margin = (pi_c - ref_c) - (pi_r - ref_r)
    loss   = -(1 - s) log sigmoid(beta * margin) - s log sigmoid(-beta * margin)

(``s`` the label smoothing, 0 for plain DPO; TRL's ``loss_type="sigmoid"``). The rewards TRL reports are
``beta * (pi - ref)`` of each reply. A batch is a `PreferenceDataset` batch (``chosen_tokens``,
``chosen_loss_mask``, ``rejected_tokens``, ``rejected_loss_mask``) plus the reference's log-probabilities
``reference_chosen_logps`` and ``reference_rejected_logps`` (`reference_logprobs`), computed before the
step without gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from halyard.models import LmBatch

PAIR_KEYS = ("chosen_tokens", "chosen_loss_mask", "rejected_tokens", "rejected_loss_mask")
REFERENCE_KEYS = ("reference_chosen_logps", "reference_rejected_logps")


class DpoTerms(NamedTuple):
    """Per-pair results of `dpo_loss`, each ``[pairs]`` float32.

    Attributes:
        losses: the DPO loss of each pair.
        chosen_rewards: ``beta * (pi_c - ref_c)``.
        rejected_rewards: ``beta * (pi_r - ref_r)``.
    """

    losses: jax.Array
    chosen_rewards: jax.Array
    rejected_rewards: jax.Array


def dpo_loss(
    policy_chosen: Float[Array, " pairs"],
    policy_rejected: Float[Array, " pairs"],
    reference_chosen: Float[Array, " pairs"],
    reference_rejected: Float[Array, " pairs"],
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> DpoTerms:
    """The DPO loss of each pair from summed reply log-probabilities (see the module docstring).

    Args:
        policy_chosen: the trained model's log-probability of each chosen reply (summed over its tokens).
        policy_rejected: the same for each rejected reply.
        reference_chosen: the reference model's log-probability of each chosen reply (no gradient flows).
        reference_rejected: the same for each rejected reply.
        beta: the inverse temperature (``dpo.beta``).
        label_smoothing: the assumed share of flipped labels (``dpo.label_smoothing``).
    """
    chosen_rewards = beta * (policy_chosen - jax.lax.stop_gradient(reference_chosen))
    rejected_rewards = beta * (policy_rejected - jax.lax.stop_gradient(reference_rejected))
    margin = chosen_rewards - rejected_rewards
    losses = -(1.0 - label_smoothing) * jax.nn.log_sigmoid(margin) - label_smoothing * jax.nn.log_sigmoid(
        -margin
    )
    return DpoTerms(losses, jax.lax.stop_gradient(chosen_rewards), jax.lax.stop_gradient(rejected_rewards))


def sequence_logprobs(
    model: Any, tokens: Int[Array, "rows width"], loss_mask: Int[Array, "rows width"]
) -> Float[Array, " rows"]:
    """Each row's summed log-probability of its target tokens (``loss_mask`` 1), predicted from the rest.

    Token ``t`` counts when ``loss_mask[t]`` is 1 and is predicted from tokens ``< t`` (the `LmBatch`
    convention). The model's own loss computes it in vocabulary blocks, so the full logits never exist.

    Args:
        model: a `halyard.models.CausalLM`.
        tokens: int ``[rows, seq_len + 1]``, each row one sequence (padding after it).
        loss_mask: 0/1 ``[rows, seq_len + 1]``.
    """
    batch = LmBatch.from_tokens(tokens, None, loss_mask)
    _, metrics = model.loss(batch, reduction="none")
    return -jnp.sum(metrics["cross_entropy"], axis=-1)


def pair_logprobs(model: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """``(chosen, rejected)`` summed reply log-probabilities ``[pairs]`` of a pair batch, in one forward.

    Raises:
        KeyError: the batch is not a preference batch (names the keys it lacks and has).
    """
    missing = [key for key in PAIR_KEYS if key not in batch]
    if missing:
        raise KeyError(f"a DPO batch needs {missing} (a PreferenceDataset batch); it has {sorted(batch)}")
    pairs = batch["chosen_tokens"].shape[0]
    tokens = jnp.concatenate([batch["chosen_tokens"], batch["rejected_tokens"]])
    mask = jnp.concatenate([batch["chosen_loss_mask"], batch["rejected_loss_mask"]])
    logps = sequence_logprobs(model, tokens, mask)
    return logps[:pairs], logps[pairs:]


def reference_logprobs(params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The reference model's summed reply log-probabilities of a pair batch, without gradients.

    This is the one place the reference enters DPO. Today ``params`` is a frozen copy of the run's
    initial weights; with LoRA (not there yet) it becomes the trained parameters with the adapters
    disabled, so no copy is needed.

    Args:
        params: the reference model (a `halyard.models.CausalLM`).
        batch: a `PreferenceDataset` batch.

    Returns:
        ``{"reference_chosen_logps", "reference_rejected_logps"}``, each float32 ``[pairs]``.
    """
    chosen, rejected = pair_logprobs(jax.lax.stop_gradient(params), batch)
    return dict(zip(REFERENCE_KEYS, (chosen, rejected), strict=True))


def dpo_loss_fn(
    beta: float, label_smoothing: float = 0.0
) -> Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict[str, jax.Array]]]:
    """``loss_fn(model, batch, key) -> (loss_sum, stats)`` for `make_train_step`.

    Sums run over pairs and ``stats["num_tokens"]`` is the number of pairs, so the step's means (and its
    accumulation over microbatches) are per pair: ``loss`` is the mean DPO loss and the other stats, named
    as TRL logs them, are ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins`` (chosen minus
    rejected), ``rewards/accuracies`` (share of pairs whose chosen reward is higher), ``logps/chosen`` and
    ``logps/rejected`` (the model's summed reply log-probabilities).

    Args:
        beta: ``dpo.beta``.
        label_smoothing: ``dpo.label_smoothing``.
    """

    def loss_fn(model: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
        del key  # the families have no dropout
        chosen, rejected = pair_logprobs(model, batch)
        terms = dpo_loss(
            chosen,
            rejected,
            batch["reference_chosen_logps"],
            batch["reference_rejected_logps"],
            beta=beta,
            label_smoothing=label_smoothing,
        )
        margins = terms.chosen_rewards - terms.rejected_rewards
        stats = {
            "num_tokens": jnp.asarray(chosen.shape[0], jnp.float32),
            "rewards/chosen": jnp.sum(terms.chosen_rewards),
            "rewards/rejected": jnp.sum(terms.rejected_rewards),
            "rewards/margins": jnp.sum(margins),
            "rewards/accuracies": jnp.sum((margins > 0).astype(jnp.float32)),
            "logps/chosen": jnp.sum(jax.lax.stop_gradient(chosen)),
            "logps/rejected": jnp.sum(jax.lax.stop_gradient(rejected)),
        }
        return jnp.sum(terms.losses), stats

    return loss_fn
