"""AdamW and Lion against hand-written numpy updates, on plain dict trees and on NamedArray trees."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from float_tolerance import FUNCTION_TERMS, SCHEDULE_TERMS, summation_tolerance

from halyard.named import Axis, NamedArray
from halyard.train.optim.config import AdamWConfig, LionConfig
from halyard.train.optim.optimizers import adamw, lion
from halyard.train.optim.schedules import warmup_decay_schedule

STEPS = 5
SIZE = 4 * 3 + 3 + 4  # the parameters, whose squared gradients the clipping norm sums
# One AdamW step in float32, against numpy in float64 on the same recorded gradients: the clipping norm
# (SIZE squares, a square root, a quotient), the moments (2 roundings each), the bias corrections (a power and
# a quotient each), the square root, the quotient and epsilon, the decay's product and sum, the cosine
# schedule (jitted here, eager in numpy's loop), the learning rate's product and the
# parameter's subtraction. A parameter's difference never feeds back into the gradients (they are the
# recorded ones), and the decay shrinks it, so the steps' differences add up: STEPS times one step's, the
# update's chain at the update's size and the subtraction at the parameter's.
ADAMW_STEP_TERMS = SIZE + 3 + 4 + 2 * (FUNCTION_TERMS + 1) + FUNCTION_TERMS + 2 + 2 + SCHEDULE_TERMS + 1
# One Lion step: the sign's argument (2 products and a sum, then a sign that must not flip), the decay's
# product and sum, the learning rate's product; the momentum's 3 roundings carry over. Then the subtraction.
LION_STEP_TERMS = 3 + 2 + 1 + 3


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
    first_sizes = [np.zeros_like(p) for p in params]  # the first moment of |g|: what its roundings scale with
    param_size = max(float(np.max(np.abs(p))) for p in params)
    step_size = 0.0  # the update's, lr * (direction + decay)
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
            # the moments' roundings are relative to the gradients' sizes, not to the moments (which cancel
            # when a gradient changes sign): the step's size with the moments of |g|
            first_sizes[index] = b1 * first_sizes[index] + (1 - b1) * np.abs(grad)
            direction = first_sizes[index] / (1 - b1 ** (step + 1)) / (np.sqrt(second_hat) + eps)
            step_size = max(
                step_size, learning_rate * float(np.max(direction + weight_decay * np.abs(param)))
            )
            param_size = max(param_size, float(np.max(np.abs(params[index]))))
    bound = summation_tolerance(step_size, STEPS * ADAMW_STEP_TERMS) + summation_tolerance(param_size, STEPS)
    for got, expected in zip(final, params, strict=True):
        np.testing.assert_allclose(got, expected, atol=bound, rtol=0)


@pytest.mark.parametrize("kind", ["dict", "named"])
def test_lion_matches_numpy(kind):
    learning_rate, weight_decay, b1, b2 = 0.05, 0.5, 0.9, 0.99
    final, gradients = run_optax(
        lion(learning_rate, beta1=b1, beta2=b2, weight_decay=weight_decay, max_grad_norm=None),
        make_params(kind),
    )

    params = flat(make_params(kind))
    momentum = [np.zeros_like(p) for p in params]
    param_size = max(float(np.max(np.abs(p))) for p in params)
    for step, grads in enumerate(gradients):
        for index, (param, grad) in enumerate(zip(params, grads, strict=True)):
            argument = b1 * momentum[index] + (1 - b1) * grad
            # the sign is the same in any order: its argument is further from 0 than float32 can move it
            addends = b1 * np.abs(momentum[index]) + (1 - b1) * np.abs(grad)
            margin = summation_tolerance(addends, (step + 1) * LION_STEP_TERMS)
            assert np.all(np.abs(argument) > margin), "a sign too close to 0 for this comparison"
            direction = np.sign(argument)
            momentum[index] = b2 * momentum[index] + (1 - b2) * grad
            update = direction + (weight_decay * param if DECAYED[index] else 0.0)
            params[index] = param - learning_rate * update
            param_size = max(param_size, float(np.max(np.abs(params[index]))))
    step_size = learning_rate * (1 + weight_decay * param_size)  # the update's: lr * (sign + decay)
    bound = summation_tolerance(step_size, STEPS * LION_STEP_TERMS) + summation_tolerance(param_size, STEPS)
    for got, expected in zip(final, params, strict=True):
        np.testing.assert_allclose(got, expected, atol=bound, rtol=0)


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
