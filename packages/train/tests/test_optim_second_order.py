"""Sophia-H and Muon: their building blocks are right, and they beat plain SGD on small hard problems."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from halyard.named import Axis, NamedArray
from halyard.train.optim.config import MuonConfig, SophiaHConfig
from halyard.train.optim.optimizers import muon, sophia_h
from halyard.train.optim.schedules import warmup_decay_schedule
from halyard.train.optim.sophia import hutchinson_diagonal_hessian

STEPS = 100


def final_loss(optimizer: optax.GradientTransformation, loss, params) -> float:
    def body(carry, _):
        params, state = carry
        grads = jax.grad(loss)(params)
        updates, state = optimizer.update(grads, state, params, loss_fn=loss)
        return (optax.apply_updates(params, updates), state), None

    run = jax.jit(lambda params: jax.lax.scan(body, (params, optimizer.init(params)), None, STEPS)[0][0])
    return float(loss(run(params)))


def best_sgd_loss(loss, params, learning_rates) -> float:
    losses = [final_loss(optax.sgd(rate), loss, params) for rate in learning_rates]
    return min(loss for loss in losses if np.isfinite(loss))


def test_hutchinson_estimate_is_unbiased_for_a_dense_quadratic():
    rng = np.random.default_rng(0)
    root = rng.normal(size=(6, 6))
    hessian = root @ root.T
    params = {"x": NamedArray(jnp.asarray(rng.normal(size=6), jnp.float32), (Axis("embed", 6),))}

    def loss(p):
        return 0.5 * p["x"].array @ jnp.asarray(hessian, jnp.float32) @ p["x"].array

    keys = jax.random.split(jax.random.key(1), 4000)
    estimates = jax.vmap(lambda key: hutchinson_diagonal_hessian(loss, params, key)["x"].array)(keys)
    np.testing.assert_allclose(estimates.mean(axis=0), np.diag(hessian), atol=0.15 * np.abs(hessian).max())
    assert not np.allclose(estimates[0], np.diag(hessian))  # single samples are noisy: the mean did the work


def test_sophia_update_is_clipped_preconditioned_momentum():
    curvature = jnp.array([4.0, 0.5, 100.0])
    params = {"x": jnp.array([1.0, 1.0, 1.0])}
    loss = lambda p: 0.5 * jnp.sum(curvature * p["x"] ** 2)
    optimizer = sophia_h(
        1.0, beta1=0.5, beta2=0.5, gamma=1.0, clip_threshold=2.0, weight_decay=0.0, max_grad_norm=None
    )
    grads = jax.grad(loss)(params)
    updates, _ = optimizer.update(grads, optimizer.init(params), params, loss_fn=loss)
    # momentum 0.5 * g, Hessian EMA 0.5 * curvature (a diagonal Hessian is estimated exactly)
    expected = -np.clip((0.5 * curvature * 1.0) / (0.5 * curvature), -2.0, 2.0)
    # every value is a curvature times a power of two, and m / h divides a number by itself: exact
    np.testing.assert_array_equal(updates["x"], expected)


def test_sophia_without_loss_fn_says_how_to_call_it():
    params = {"x": jnp.ones(2)}
    optimizer = sophia_h(0.1, weight_decay=0.0, max_grad_norm=None)
    with pytest.raises(ValueError, match="loss_fn=lambda p: loss"):
        optimizer.update(params, optimizer.init(params), params)


def test_sophia_beats_sgd_on_an_ill_conditioned_quadratic():
    size = 32
    curvature = jnp.logspace(-3, 0, size)
    start = 1 / jnp.sqrt(curvature) * jnp.where(jnp.arange(size) % 2 == 0, 1.0, -1.0)
    params = {"x": NamedArray(start, (Axis("embed", size),))}

    def loss(p):
        return 0.5 * jnp.sum(curvature * p["x"].array ** 2)

    initial = float(loss(params))
    sgd = best_sgd_loss(loss, params, [0.5, 1.0, 1.5, 1.9])  # 2 / max curvature is the stability limit
    sophia = final_loss(sophia_h(0.5, gamma=1.0, weight_decay=0.0, max_grad_norm=None), loss, params)
    assert sophia < 0.5 * sgd < initial


def test_configs_build_working_optimizers():
    params = {"w": jnp.ones((2, 2))}
    loss = lambda p: jnp.sum(p["w"] ** 2)
    for config in (SophiaHConfig(learning_rate=0.05), MuonConfig(learning_rate=0.05)):
        assert final_loss(config.build(STEPS), loss, params) < 0.5 * float(loss(params))


def least_squares_problem():
    key_inputs, key_target = jax.random.split(jax.random.key(0))
    inputs = jax.random.normal(key_inputs, (64, 32)) @ jnp.diag(jnp.logspace(-1.5, 0, 32))
    targets = inputs @ jax.random.normal(key_target, (32, 16))
    Embed, Out = Axis("embed", 32), Axis("out", 16)
    params = {"w": NamedArray(jnp.zeros((32, 16)), (Embed, Out))}

    def loss(p):
        return jnp.mean((inputs @ p["w"].array - targets) ** 2)

    return params, loss


def test_muon_beats_sgd_on_ill_conditioned_least_squares():
    params, loss = least_squares_problem()
    sgd = best_sgd_loss(loss, params, [1.0, 3.0, 10.0, 15.0])  # diverges above ~20
    schedule = warmup_decay_schedule(1.0, STEPS, shape="linear")
    muon_loss = final_loss(muon(schedule, weight_decay=0.0, max_grad_norm=None), loss, params)
    assert muon_loss < 0.2 * sgd


def test_muon_update_of_a_matrix_is_orthogonal_up_to_scale():
    rng = np.random.default_rng(0)
    left, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    right, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    gradient = left[:, :4] @ np.diag([100.0, 10.0, 1.0, 0.1]) @ right
    params = {"w": jnp.zeros((8, 4)), "bias": jnp.zeros(4)}
    grads = {"w": jnp.asarray(gradient, jnp.float32), "bias": jnp.ones(4)}
    transform = muon(0.5, nesterov=False, weight_decay=0.0, max_grad_norm=None)
    updates, _ = transform.update(grads, transform.init(params), params)
    singular_values = np.linalg.svd(np.asarray(updates["w"]), compute_uv=False)
    assert singular_values.max() / singular_values.min() < 2.0  # the gradient's ratio was 1000
    # Newton-Schulz leaves singular values near 1; the update is scaled to 0.2 * sqrt(8) times that
    assert 0.5 < singular_values.mean() / (0.2 * np.sqrt(8) * 0.5) < 1.5
    np.testing.assert_allclose(np.abs(updates["bias"]), 0.5, rtol=1e-4)  # Adam's first step is +-lr
