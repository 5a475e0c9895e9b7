"""Indexing by name, take, dynamic slices and .at updates, against numpy positional indexing."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from named_strategies import axis_pools, check_grads_jitted, numpy_aligned, seeds, subsets, values

import halyard.named as hn
from halyard.named import Axis


@st.composite
def indexers(draw, x):
    """A random {name: int | slice} over some of x's axes, and the equivalent numpy index tuple."""
    chosen = draw(subsets(x.axes))
    by_name = {}
    for axis in chosen:
        if draw(st.booleans()):
            by_name[axis.name] = draw(st.integers(-axis.size, axis.size - 1))
        else:
            start = draw(st.none() | st.integers(-axis.size, axis.size))
            stop = draw(st.none() | st.integers(-axis.size, axis.size))
            step = draw(st.none() | st.integers(1, 2))
            by_name[axis.name] = slice(start, stop, step)
    numpy_index = tuple(by_name.get(a.name, slice(None)) for a in x.axes)
    return by_name, numpy_index


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_basic_indexing_matches_numpy(data, pool, seed):
    x = values(data.draw(st.permutations(pool)), seed)
    by_name, numpy_index = data.draw(indexers(x))
    expected = np.asarray(x.array)[numpy_index]
    flat = tuple(itertools.chain.from_iterable(by_name.items()))
    for out in [x[by_name]] + ([x[flat]] if flat else []):
        kept = [a.name for a in x.axes if not isinstance(by_name.get(a.name), int)]
        assert out.axis_names == tuple(kept)
        assert tuple(out.shape.values()) == expected.shape
        np.testing.assert_array_equal(out.array, expected)


@given(data=st.data(), pool=axis_pools(), seed=seeds, index_seed=seeds)
def test_take_with_new_axes(data, pool, seed, index_seed):
    x = values(data.draw(st.permutations(pool)), seed)
    axis = data.draw(st.sampled_from(x.axes))
    k = x.axis_names.index(axis.name)
    rng = np.random.default_rng(index_seed)
    index_axes = data.draw(st.lists(st.sampled_from([Axis("i", 2), Axis("j", 3)]), unique=True))
    raw_index = rng.integers(-axis.size, axis.size, [a.size for a in index_axes])
    indices = hn.named(jnp.asarray(raw_index), tuple(index_axes))
    out = hn.take(x, axis.name, indices)
    assert out.axes == x.axes[:k] + tuple(index_axes) + x.axes[k + 1 :]
    np.testing.assert_array_equal(out.array, np.take(np.asarray(x.array), raw_index, axis=k))
    np.testing.assert_array_equal(x[axis.name, indices].array, out.array)


@settings(max_examples=15)
@given(data=st.data(), pool=axis_pools(min_axes=2), seed=seeds, index_seed=seeds)
def test_take_batched_over_shared_axes(data, pool, seed, index_seed):
    x = values(data.draw(st.permutations(pool)), seed)
    axis = data.draw(st.sampled_from(x.axes))
    shared = data.draw(subsets(tuple(a for a in x.axes if a != axis), min_size=1))
    index_axes = data.draw(st.permutations(shared + (Axis("i", 2),)))
    rng = np.random.default_rng(index_seed)
    raw_index = rng.integers(0, axis.size, [a.size for a in index_axes])
    indices = hn.named(jnp.asarray(raw_index), tuple(index_axes))
    out = hn.take(x, axis.name, indices)
    k = x.axis_names.index(axis.name)
    assert out.axes == x.axes[:k] + (Axis("i", 2),) + x.axes[k + 1 :]
    raw_x = np.asarray(x.array)
    expected = np.empty(tuple(a.size for a in out.axes), np.float32)
    for position in itertools.product(*(range(a.size) for a in out.axes)):
        where = dict(zip(out.axis_names, position))
        chosen = raw_index[tuple(where[a.name] for a in index_axes)]
        source = tuple(chosen if a.name == axis.name else where[a.name] for a in x.axes)
        expected[position] = raw_x[source]
    np.testing.assert_array_equal(out.array, expected)


def test_take_clamps_out_of_range_and_wraps_negative():
    x = hn.named(jnp.arange(5.0), ("pos",))
    indices = hn.named(jnp.array([-1, -5, 7, -9]), ("i",))
    np.testing.assert_array_equal(hn.take(x, "pos", indices).array, [4.0, 0.0, 4.0, 0.0])


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_dynamic_slice_under_jit(data, pool, seed):
    x = values(data.draw(st.permutations(pool)), seed)
    axis = data.draw(st.sampled_from(x.axes))
    length = data.draw(st.integers(1, axis.size))
    start = data.draw(st.integers(0, axis.size - length))
    out = jax.jit(lambda v, s: hn.dynamic_slice(v, axis.name, s, length))(x, start)
    k = x.axis_names.index(axis.name)
    expected = np.take(np.asarray(x.array), np.arange(start, start + length), axis=k)
    assert out.axis(axis.name).size == length
    np.testing.assert_array_equal(out.array, expected)


@given(data=st.data(), pool=axis_pools(), seed=seeds, op=st.sampled_from(["set", "add", "multiply"]))
def test_at_updates_match_numpy(data, pool, seed, op):
    x = values(data.draw(st.permutations(pool)), seed)
    by_name, numpy_index = data.draw(indexers(x))
    target = x.at[by_name].get()
    update_axes = data.draw(subsets(target.axes))
    update = values(tuple(update_axes), seed + 1)  # fewer axes, any order: broadcast by name
    out = getattr(x.at[by_name], op)(update)
    expected = np.array(x.array)
    aligned = np.broadcast_to(numpy_aligned(update, target.axes), expected[numpy_index].shape)
    if op == "set":
        expected[numpy_index] = aligned
    elif op == "add":
        expected[numpy_index] += aligned
    else:
        expected[numpy_index] *= aligned
    assert out.axes == x.axes
    np.testing.assert_array_equal(out.array, expected)  # one correctly rounded operation per element


def test_at_scalar_updates_and_min_max():
    x = hn.named(jnp.arange(6.0).reshape(2, 3), ("batch", "pos"))
    np.testing.assert_array_equal(x.at["pos", 1].set(9.0).array, [[0, 9, 2], [3, 9, 5]])
    np.testing.assert_array_equal(x.at["batch", 1].min(4.0).array, [[0, 1, 2], [3, 4, 4]])
    np.testing.assert_array_equal(x.at["batch", 0].max(1.0).array, [[1, 1, 2], [3, 4, 5]])
    with pytest.raises(TypeError, match="no axis names"):
        x.at["batch", 0].set(jnp.ones(3))


def test_dynamic_update_slice_by_name():
    x = hn.zeros((Axis("batch", 2), Axis("pos", 5)))
    update = hn.named(jnp.ones((2, 1)), ("pos", "batch"))  # not x's order: aligned by name
    out = jax.jit(lambda v, s: hn.dynamic_update_slice(v, {"pos": s}, update))(x, 3)
    expected = np.zeros((2, 5))
    expected[0, 3:5] = 1  # pos 3..4 of batch 0
    np.testing.assert_array_equal(out.array, expected)


def test_indexing_gradients():
    axes = (Axis("batch", 2), Axis("pos", 4))
    x = values(axes, 0)
    indices = hn.named(jnp.array([3, 0, 1]), ("i",))

    def f(raw):
        v = hn.named(raw, axes)
        return (
            hn.take(v, "pos", indices).sum("i") + v["pos", 1:3].sum("pos") + v.at["pos", 0].set(2.0).sum()
        ).array

    check_grads_jitted(f, (x.array,), order=1, modes=("fwd", "rev"))


def test_indexing_errors():
    x = values((Axis("batch", 2), Axis("pos", 4)), 0)
    with pytest.raises(KeyError, match=r"'embed' is not among \(batch=2, pos=4\)"):
        x["embed", 0]
    with pytest.raises(TypeError, match="Index a NamedArray by name"):
        x[0]
    with pytest.raises(IndexError, match="out of range for axis 'pos' of size 4"):
        x["pos", 4]
    with pytest.raises(ValueError, match="indexed twice"):
        x[{"pos": 0, Axis("pos", 4): 1}]
    with pytest.raises(ValueError, match="must not have the indexed axis 'pos'"):
        hn.take(x, "pos", hn.named(jnp.array([0]), ("pos",)))
    with pytest.raises(TypeError, match="not iterable by position"):
        list(x)
