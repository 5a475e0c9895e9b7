"""muP: coordinate check across widths, initialisation scales, qk scale and learning-rate multipliers."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import LmBatch, init_model, lr_multipliers, model_config
from halyard.named import NamedArray, named

WIDTHS = (64, 128, 256, 512)


def _config(width: int, **overrides):
    fields = dict(
        vocab_size=64, hidden_size=width, d_base=64, head_dim=16, ff_multiple=2, num_layers=2, max_position=64,
        loss_block_size=None, attention_implementation="reference",
    )  # fmt: skip
    fields.update(overrides)
    return model_config("mup", **fields)


def _data(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    # a learnable stream: token t+1 = (3 * token t + noise) mod 64
    starts = rng.integers(0, 64, size=(steps, 4, 1))
    offsets = np.arange(17)[None, :]
    return [np.asarray((starts[s] * 5 + 3 * offsets) % 64, np.int32) for s in range(steps)]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _train_and_measure(
    config, learning_rate: float, batches: jax.Array, tokens: NamedArray
) -> dict[str, jax.Array]:
    """Init, a few steps of plain Adam (no optax dependency) with muP learning rates, then coordinates.

    One compiled program per width (a loop over the steps, not one copy per step)."""
    model = init_model(config, jax.random.key(0))
    multipliers, _ = eqx.partition(lr_multipliers(config, model), lambda x: isinstance(x, float))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    zeros = jax.tree.map(jnp.zeros_like, params)

    def step(index, state):
        params, first, second = state
        loss_fn = lambda p: eqx.combine(p, static).loss(LmBatch.from_tokens(batches[index]))[0]
        grads = jax.grad(loss_fn)(params)
        first = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, first, grads)
        second = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, second, grads)
        count = index + 1
        correction1, correction2 = 1 - 0.9**count, 1 - 0.999**count
        params = jax.tree.map(
            lambda p, m, v, mult: p - learning_rate * mult * (m / correction1) / (jnp.sqrt(v / correction2) + 1e-8),
            params, first, second, multipliers,
        )  # fmt: skip
        return params, first, second

    params, _, _ = jax.lax.fori_loop(0, batches.shape[0], step, (params, zeros, zeros))
    return eqx.combine(params, static).coordinates(tokens)


def test_coordinate_check_is_flat_across_widths() -> None:
    tokens = named(jnp.asarray(_data(1)[0][:, :16]), ("batch", "pos"))
    batches = jnp.asarray(np.stack(_data(3)))
    coordinates = {}
    for width in WIDTHS:
        coordinates[width] = jax.tree.map(
            np.asarray, _train_and_measure(_config(width), 1e-2, batches, tokens)
        )
    for name in ("attention", "mlp", "residual", "logits"):
        values = np.stack([np.atleast_1d(coordinates[w][name]) for w in WIDTHS])  # [width, layer]
        ratio = values.max(axis=0) / values.min(axis=0)
        assert np.all(ratio < 2.0), f"{name}: mean |activation| per width {values.tolist()} varies by {ratio}"
