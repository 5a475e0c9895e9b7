"""AdamW and Lion against hand-written numpy updates, on plain dict trees and on NamedArray trees."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from halyard.named import Axis, NamedArray
from halyard.train.optim.config import AdamWConfig, LionConfig
from halyard.train.optim.optimizers import adamw, lion
from halyard.train.optim.schedules import warmup_decay_schedule

STEPS = 5


def make_params(kind: str) -> dict:
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(4, 3)).astype(np.float32)
    bias = rng.normal(size=(3,)).astype(np.float32)
    norm = rng.normal(size=(4,)).astype(np.float32)
    if kind == "dict":
        return {
            "dense": {"weight": jnp.asarray(weight), "bias": jnp.asarray(bias)},
            "norm": jnp.asarray(norm),
        }
    embed, mlp = Axis("embed", 4), Axis("mlp", 3)
    return {
        "dense": {
            "weight": NamedArray(jnp.asarray(weight), (embed, mlp)),
            "bias": NamedArray(jnp.asarray(bias), (mlp,)),
        },
        "norm": NamedArray(jnp.asarray(norm), (embed,)),
    }


def flat(tree: dict) -> list[np.ndarray]:
    return [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(tree)]


def loss(params: dict) -> jax.Array:
    leaves = jax.tree.leaves(params)
    return sum(jnp.sum(jnp.sin(3 * leaf) * leaf**2) for leaf in leaves)


def run_optax(optimizer: optax.GradientTransformation, params: dict) -> tuple[list, list]:
    @jax.jit
    def step(params: dict, state: optax.OptState) -> tuple[dict, optax.OptState, dict]:
        grads = jax.grad(loss)(params)
        updates, state = optimizer.update(grads, state, params, loss_fn=loss)
        return optax.apply_updates(params, updates), state, grads

    state = optimizer.init(params)
    gradients = []
    for _ in range(STEPS):
        params, state, grads = step(params, state)
        gradients.append(flat(grads))
    return flat(params), gradients


def clipped(grads: list[np.ndarray], max_norm: float) -> list[np.ndarray]:
    norm = np.sqrt(sum(np.sum(g**2) for g in grads))
    return [g * min(1.0, max_norm / norm) for g in grads]


# leaf order of jax.tree.leaves: dense.bias, dense.weight, norm; only the matrix decays by default
DECAYED = [False, True, False]


@pytest.mark.parametrize("kind", ["dict", "named"])
def test_adamw_matches_numpy(kind):
    peak, weight_decay, max_norm, b1, b2, eps = 0.1, 0.3, 0.5, 0.9, 0.95, 1e-8
    schedule = warmup_decay_schedule(peak, total_steps=STEPS, warmup_steps=2, shape="cosine")
    final, gradients = run_optax(
        adamw(schedule, beta1=b1, beta2=b2, epsilon=eps, weight_decay=weight_decay, max_grad_norm=max_norm),
        make_params(kind),
    )

    params = flat(make_params(kind))
    first = [np.zeros_like(p) for p in params]
    second = [np.zeros_like(p) for p in params]
    for step, raw in enumerate(gradients):
        # the gradients were recorded along the same trajectory; recompute the trajectory in numpy
        grads = clipped(raw, max_norm)
        learning_rate = float(schedule(step))
        for index, (param, grad) in enumerate(zip(params, grads, strict=True)):
            first[index] = b1 * first[index] + (1 - b1) * grad
            second[index] = b2 * second[index] + (1 - b2) * grad**2
            first_hat = first[index] / (1 - b1 ** (step + 1))
            second_hat = second[index] / (1 - b2 ** (step + 1))
            update = first_hat / (np.sqrt(second_hat) + eps) + (
                weight_decay * param if DECAYED[index] else 0.0
            )
            params[index] = param - learning_rate * update
    for got, expected in zip(final, params, strict=True):
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kind", ["dict", "named"])
def test_lion_matches_numpy(kind):
    learning_rate, weight_decay, b1, b2 = 0.05, 0.5, 0.9, 0.99
    final, gradients = run_optax(
        lion(learning_rate, beta1=b1, beta2=b2, weight_decay=weight_decay, max_grad_norm=None),
        make_params(kind),
    )

    params = flat(make_params(kind))
    momentum = [np.zeros_like(p) for p in params]
    for grads in gradients:
        for index, (param, grad) in enumerate(zip(params, grads, strict=True)):
            direction = np.sign(b1 * momentum[index] + (1 - b1) * grad)
            momentum[index] = b2 * momentum[index] + (1 - b2) * grad
            update = direction + (weight_decay * param if DECAYED[index] else 0.0)
            params[index] = param - learning_rate * update
    for got, expected in zip(final, params, strict=True):
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


def test_adamw_config_builds_the_same_optimizer_as_the_function():
    config = AdamWConfig(learning_rate=0.01, weight_decay=0.2, max_grad_norm=None, beta2=0.99)
    params = make_params("named")
    from_config, _ = run_optax(config.build(total_steps=STEPS), params)
    schedule = config.schedule.build(0.01, STEPS)
    from_function, _ = run_optax(adamw(schedule, beta2=0.99, weight_decay=0.2, max_grad_norm=None), params)
    for a, b in zip(from_config, from_function, strict=True):
        np.testing.assert_array_equal(a, b)


def test_lion_config_uses_its_betas():
    params = make_params("dict")
    config = LionConfig(learning_rate=0.01, beta1=0.5, max_grad_norm=None, weight_decay=0.0)
    from_config, _ = run_optax(config.build(total_steps=STEPS), params)
    from_function, _ = run_optax(
        lion(config.schedule.build(0.01, STEPS), beta1=0.5, weight_decay=0.0, max_grad_norm=None), params
    )
    for a, b in zip(from_config, from_function, strict=True):
        np.testing.assert_array_equal(a, b)


def test_updates_keep_named_axes():
    params = make_params("named")
    optimizer = AdamWConfig().build(total_steps=10)
    updates, _ = jax.jit(optimizer.update)(jax.grad(loss)(params), optimizer.init(params), params)
    assert updates["dense"]["weight"].axes == params["dense"]["weight"].axes
