"""zeros/ones/full/arange/one_hot and random init by axes, against numpy / jax.random."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import halyard.named as hn
from halyard.named import Axis

Batch, Embed, Vocab = Axis("batch", 3), Axis("embed", 4), Axis("vocab", 6)


def test_constant_constructors():
    assert hn.zeros((Batch, Embed)).axes == (Batch, Embed)
    np.testing.assert_array_equal(hn.zeros((Batch, Embed)).array, np.zeros((3, 4)))
    np.testing.assert_array_equal(hn.ones(Embed, jnp.int32).array, np.ones(4, np.int32))
    full = hn.full((Embed, Batch), 2.5)
    assert full.axes == (Embed, Batch) and float(full.array[1, 2]) == 2.5
    x = hn.arange(Embed)
    assert hn.zeros_like(x).dtype == x.dtype and hn.ones_like(x, jnp.float32).dtype == jnp.float32
    np.testing.assert_array_equal(hn.full_like(x, 7).array, np.full(4, 7))


def test_arange():
    np.testing.assert_array_equal(hn.arange(Embed).array, np.arange(4))
    np.testing.assert_array_equal(hn.arange(Embed, start=3, step=2).array, np.arange(3, 11, 2))
    # quarters from a half: exact in float32
    np.testing.assert_array_equal(hn.arange(Embed, 0.5, 0.25, jnp.float32).array, np.arange(4) * 0.25 + 0.5)


def test_constructors_refuse_bare_names_and_duplicates():
    with pytest.raises(TypeError, match="Axis\\('embed', size\\)"):
        hn.zeros(("embed",))
    with pytest.raises(ValueError, match="unique"):
        hn.zeros((Embed, Embed))


def test_one_hot():
    ids = hn.named(jnp.array([0, 5, 2]), ("batch",))
    out = hn.one_hot(ids, Vocab)
    assert out.axes == (Batch, Vocab)
    np.testing.assert_array_equal(out.array, np.eye(6)[[0, 5, 2]])
    out_of_range = hn.one_hot(hn.named(jnp.array([6, -1]), ("batch",)), Vocab)
    assert np.all(np.asarray(out_of_range.array) == 0)
    np.testing.assert_array_equal(hn.one_hot(3, Vocab).array, np.eye(6)[3])
    with pytest.raises(ValueError, match="already have an axis 'vocab'"):
        hn.one_hot(hn.arange(Vocab), Vocab)
    with pytest.raises(TypeError, match="no axis names"):
        hn.one_hot(jnp.array([1, 2]), Vocab)


def test_random_matches_jax_random_with_the_same_shape():
    key = jax.random.key(3)
    np.testing.assert_array_equal(
        hn.random.normal(key, (Batch, Embed)).array, jax.random.normal(key, (3, 4), jnp.float32)
    )
    np.testing.assert_array_equal(
        hn.random.uniform(key, (Batch, Embed), -1.0, 2.0).array,
        jax.random.uniform(key, (3, 4), minval=-1, maxval=2),
    )
    np.testing.assert_array_equal(
        hn.random.truncated_normal(key, Embed, -1.5, 1.0).array,
        jax.random.truncated_normal(key, -1.5, 1.0, (4,)),
    )
    np.testing.assert_array_equal(
        hn.random.bernoulli(key, Embed, 0.3).array, jax.random.bernoulli(key, 0.3, (4,))
    )
    np.testing.assert_array_equal(
        hn.random.randint(key, Embed, 2, 9).array, jax.random.randint(key, (4,), 2, 9)
    )


def test_random_bounds_broadcast_by_name():
    key = jax.random.key(0)
    low = hn.arange(Embed, dtype=jnp.float32)
    sample = hn.random.uniform(key, (Batch, Embed), low, low + 0.5)
    values = np.asarray(sample.array)
    assert np.all(values >= np.arange(4)) and np.all(values < np.arange(4) + 0.5)
    t = hn.random.truncated_normal(key, (Batch, Embed), -0.5, 0.5)
    assert np.all(np.abs(np.asarray(t.array)) <= 0.5)
    p = hn.named(jnp.array([0.0, 1.0, 0.0, 1.0]), ("embed",))
    flips = np.asarray(hn.random.bernoulli(key, (Batch, Embed), p).array)
    np.testing.assert_array_equal(flips, np.tile([False, True, False, True], (3, 1)))


def test_categorical_and_permutation():
    key = jax.random.key(1)
    logits = hn.named(jnp.log(jnp.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]) + 1e-30), ("batch", "vocab"))
    sample = hn.random.categorical(key, logits, "vocab")
    assert sample.axis_names == ("batch",)
    np.testing.assert_array_equal(sample.array, [1, 0])
    x = hn.named(jnp.arange(12).reshape(3, 4), ("batch", "embed"))
    shuffled = hn.random.permutation(key, x, "embed")
    assert shuffled.axes == x.axes
    rows = np.asarray(shuffled.array)
    np.testing.assert_array_equal(np.sort(rows, axis=1), np.asarray(x.array))
    np.testing.assert_array_equal(rows - rows[:, :1], np.tile(rows[0] - rows[0, 0], (3, 1)))
