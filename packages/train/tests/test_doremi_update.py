"""DoReMi's domain-weight update against an independent NumPy transcription of the paper's Algorithm 1
(Xie et al. 2023): random per-token losses, domain counts, batches where a domain is absent, several steps."""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
from float_tolerance import FUNCTION_TERMS
from hypothesis import given, settings
from hypothesis import strategies as st

from halyard.train.doremi.loss import doremi_loss_fn

EPS, TINY = float(np.finfo(np.float32).eps), float(np.finfo(np.float32).tiny)


def algorithm_1(
    proxy: list[np.ndarray],
    reference: list[np.ndarray],
    target: list[np.ndarray],
    domains: list[np.ndarray],
    k: int,
    step_size: float = 1.0,
    smoothing: float = 1e-3,
) -> tuple[list[np.ndarray], list[float], np.ndarray]:
    """Algorithm 1, token by token: for each step the weights alpha_t, the proxy's objective, and at the end
    the average of alpha_1 .. alpha_T (alpha_0 is uniform)."""
    alpha = np.full(k, 1.0 / k)
    history, objectives = [], []
    for losses, ref, mask, rows in zip(proxy, reference, target, domains, strict=True):
        excess = np.zeros(k)
        for i in range(k):
            tokens = [
                (losses[r, j], ref[r, j])
                for r in range(len(rows))
                if rows[r] == i
                for j in range(losses.shape[1])
                if mask[r, j]
            ]
            if tokens:  # excess loss clipped at 0, averaged over the domain's tokens
                excess[i] = sum(max(p - q, 0.0) for p, q in tokens) / len(tokens)
        moved = alpha * np.exp(step_size * excess)
        alpha = (1 - smoothing) * moved / moved.sum() + smoothing / k
        objective = 0.0
        for i in range(k):
            tokens = [
                losses[r, j]
                for r in range(len(rows))
                if rows[r] == i
                for j in range(losses.shape[1])
                if mask[r, j]
            ]
            if tokens:
                objective += alpha[i] * sum(tokens) / len(tokens)
        history.append(alpha)
        objectives.append(objective)
    return history, objectives, np.mean(history, axis=0)


class _GivenLosses:
    """A model whose per-position loss is its one parameter (the test's losses)."""

    def __init__(self, losses: jax.Array):
        self.losses = losses

    def loss(self, batch: Any, *, key: Any, z_loss_weight: float, reduction: str) -> tuple[jax.Array, dict]:
        assert reduction == "none"
        return self.losses, {}


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    k = draw(st.integers(1, 5))
    rows, width, steps = draw(st.integers(1, 5)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    losses = hnp.arrays(np.float32, (rows, width), elements=st.floats(0, 8, width=32))
    run: dict[str, list[np.ndarray]] = {"proxy": [], "reference": [], "target": [], "domains": []}
    for _ in range(steps):
        run["proxy"].append(draw(losses))
        run["reference"].append(draw(losses))
        # Rows drawn from a subset of the domains: some steps lack some domains.
        present = draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=k, unique=True))
        run["domains"].append(
            np.array(draw(st.lists(st.sampled_from(present), min_size=rows, max_size=rows)))
        )
        run["target"].append(draw(hnp.arrays(np.int32, (rows, width), elements=st.integers(0, 1))))
    return {"k": k, **run}


def weight_terms(run: dict[str, Any], smoothing: float = 1e-3) -> list[float]:
    """Each step's relative error of the float32 weights against the float64 (partly float32) transcription,
    in eps, at first order.

    A step's softmax argument ``log w + excess`` differs by: the previous weights' relative error (an
    absolute one in ``log w``), the log's own error at ``|log w|``, the excess's mean over at most ``n``
    tokens of clipped differences of size at most ``X`` (a subtraction, ``n`` additions, a division) and the
    sum (at ``|log w| + X``) and the max's subtraction (at twice that). A softmax's output errs by its argument's errors minus
    their weighted mean (a softmax is shift-invariant), so the spread of the log-errors, not their size, is
    what carries: the new errors add at most twice their bound to it each step, with the exp, the k-sum and
    the division, and the smoothing's mix with ``s / k`` (a weight in [0, 1] times errors straddling 0) keeps
    it. So the bound grows linearly over the steps, not by doubling.
    """
    k = run["k"]
    log_weights = float(-np.log(smoothing / k))  # the smallest weight is s / k
    spread, bounds = 0.0, []
    for proxy, reference in zip(run["proxy"], run["reference"], strict=True):
        n = proxy.size
        excess = float(np.max(np.maximum(proxy.astype(np.float64) - reference, 0.0), initial=0.0))
        argument = FUNCTION_TERMS * log_weights + (n + 2) * excess + 3 * (log_weights + excess)
        spread += 2 * argument + 2 * FUNCTION_TERMS + k + 1 + 3
        bounds.append(spread)
    return bounds


@settings(max_examples=60, deadline=None)
@given(runs())
def test_the_weights_follow_algorithm_1(run: dict[str, Any]) -> None:
    k = run["k"]
    expected, objectives, average = algorithm_1(
        run["proxy"], run["reference"], run["target"], run["domains"], k
    )
    terms = weight_terms(run)
    loss_fn = doremi_loss_fn(step_size=1.0, smoothing=1e-3)
    weights = jnp.full(k, 1.0 / k)
    total = jnp.zeros(k)
    for t, (proxy, reference, mask, rows) in enumerate(
        zip(run["proxy"], run["reference"], run["target"], run["domains"], strict=True)
    ):
        tokens = np.zeros((len(rows), proxy.shape[1] + 1), np.int32)
        batch = {
            "tokens": tokens,
            "loss_mask": np.concatenate([np.ones((len(rows), 1), np.int32), mask], axis=1),
            "source_one_hot": np.eye(k, dtype=np.int32)[rows],
            "reference_loss": jnp.asarray(reference),
            "domain_weights": weights,
        }

        def objective(losses: jax.Array, batch: dict[str, Any] = batch) -> tuple[jax.Array, dict]:
            loss_sum, stats = loss_fn(_GivenLosses(losses), batch, jax.random.PRNGKey(0))
            return loss_sum / jnp.maximum(stats["num_tokens"], 1.0), stats

        (value, stats), grad = jax.value_and_grad(objective, has_aux=True)(jnp.asarray(proxy))
        weight_error = EPS * terms[t]  # relative, every weight is at least smoothing / k
        np.testing.assert_allclose(stats["domain_weights"], expected[t], rtol=weight_error, atol=0)
        # the weights' error, each domain's sum of at most n positive losses, its division, the k-sum of the
        # products, the loss_fn's product with the tokens and the test's division by them
        objective_error = weight_error + EPS * (proxy.size + k + 4)
        # XLA's CPU flushes subnormal float32 values to 0: each loss, sum, mean or product below the smallest
        # normal number may be lost
        flushed = TINY * (proxy.size + 3 * k + 2)
        np.testing.assert_allclose(float(value), objectives[t], rtol=objective_error, atol=flushed)
        # The gradient reaches each target token as its domain's weight over its tokens; none through the weights.
        counts = np.array([(mask * (rows == i)[:, None]).sum() for i in range(k)], np.float64)
        per_token = expected[t][rows][:, None] * mask / np.maximum(counts[rows], 1)[:, None]
        # the weight's error and the backward pass's products and divisions (a non-target's 0 is exact)
        np.testing.assert_allclose(grad, per_token, rtol=weight_error + 6 * EPS, atol=0)
        weights = stats["domain_weights"]
        total = total + weights
    steps = len(run["proxy"])  # the mean's additions and division, at the largest weights' error
    np.testing.assert_allclose(total / steps, average, rtol=EPS * (max(terms) + steps + 1), atol=0)
