"""absmax_int8: every element within half a scale step, zeros kept, one scale per slice; stochastic rounding
within a step, unbiased, and the same bits for the same inputs (also sharded)."""

import jax
import jax.numpy as jnp
import numpy as np

from halyard.named.nn import INT8_MAX, absmax_int8


def test_values_are_within_half_a_step_and_the_peak_is_exact() -> None:
    x = jax.random.normal(jax.random.key(0), (5, 33), jnp.float32) * jnp.arange(1, 6)[:, None]
    q, scale = absmax_int8(x, 1)
    assert q.dtype == jnp.int8 and scale.shape == (5, 1) and scale.dtype == jnp.float32
    error = np.abs(np.asarray(q, np.float32) * np.asarray(scale) - np.asarray(x))
    assert np.all(error <= np.asarray(scale) / 2 * (1 + 1e-6))
    assert np.array_equal(np.abs(np.asarray(q)).max(axis=1), np.full(5, INT8_MAX))


def test_a_slice_of_zeros_stays_zero_and_bfloat16_is_read_in_float32() -> None:
    x = jnp.zeros((3, 4), jnp.bfloat16).at[1].set(jnp.array([1.0, -2.0, 0.5, 4.0], jnp.bfloat16))
    q, scale = absmax_int8(x, (1,))
    assert np.array_equal(np.asarray(q[0]), np.zeros(4)) and float(scale[0, 0]) == 1.0
    assert np.array_equal(np.asarray(q[1]), np.round(np.array([1.0, -2.0, 0.5, 4.0]) * INT8_MAX / 4.0))


def test_stochastic_rounding_is_within_a_step_unbiased_and_repeats_its_bits() -> None:
    # Every row: its peak 1, then 1,023 values a quarter of a step (1/127) each, which round to nearest to 0.
    x = jnp.full((8, 1024), 0.25 / INT8_MAX).at[:, 0].set(1.0)
    assert not np.any(np.asarray(absmax_int8(x, 1)[0])[:, 1:])
    q, scale = absmax_int8(x, 1, stochastic=True)
    np.testing.assert_array_equal(np.asarray(q), np.asarray(absmax_int8(x, 1, stochastic=True)[0]))
    error = np.asarray(q, np.float64) * np.asarray(scale) - np.asarray(x, np.float64)
    assert np.all(np.abs(error) < np.asarray(scale))  # within a whole step
    assert set(np.unique(np.asarray(q)[:, 1:])) == {0, 1}
    assert abs(np.asarray(q, np.float64)[:, 1:].mean() - 0.25) < 0.03  # unbiased: on average a quarter step
