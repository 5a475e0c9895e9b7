"""split / concatenate / stack / unstack by name, against numpy on random axes and orders."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from named_strategies import axis_pools, check_grads_jitted, seeds, values

import halyard.named as hn
from halyard.named import Axis


@given(
    data=st.data(), pool=axis_pools(), seed=seeds, sizes=st.lists(st.integers(0, 3), min_size=1, max_size=3)
)
def test_concatenate_then_split_round_trips(data, pool, seed, sizes):
    others = tuple(a for a in pool if a.name != "pos")
    pieces = []
    for i, size in enumerate(sizes):
        # Each piece has its axes in its own random order: concatenate aligns by name to the first.
        axes = data.draw(st.permutations((*others, Axis("pos", size))))
        pieces.append(values(tuple(axes), seed + i))
    out = hn.concatenate("pos", pieces)
    first = pieces[0]
    assert out.axis_names == first.axis_names and out.axis_size("pos") == sum(sizes)
    k = first.axis_names.index("pos")
    aligned = [
        np.transpose(np.asarray(p.array), [p.axis_names.index(n) for n in first.axis_names]) for p in pieces
    ]
    np.testing.assert_array_equal(out.array, np.concatenate(aligned, axis=k))
    back = hn.split(out, "pos", sizes)
    for piece, original in zip(back, aligned):
        assert piece.axis_names == first.axis_names
        np.testing.assert_array_equal(piece.array, original)


@given(data=st.data(), pool=axis_pools(min_axes=0), seed=seeds, count=st.integers(1, 3))
def test_stack_and_unstack(data, pool, seed, count):
    pieces = [values(tuple(data.draw(st.permutations(pool))), seed + i) for i in range(count)]
    out = hn.stack("layers", pieces)
    assert out.axes == (Axis("layers", count),) + pieces[0].axes
    first = pieces[0].axis_names
    aligned = [np.transpose(np.asarray(p.array), [p.axis_names.index(n) for n in first]) for p in pieces]
    np.testing.assert_array_equal(out.array, np.stack(aligned))
    for piece, original in zip(hn.unstack(out, "layers"), aligned):
        np.testing.assert_array_equal(piece.array, original)


def test_split_into_named_pieces():
    x = values((Axis("batch", 2), Axis("qkv", 7)), 0)
    q, kv = hn.split(x, "qkv", [Axis("q", 3), 4])
    assert q.axis_names == ("batch", "q") and kv.axes == (Axis("batch", 2), Axis("qkv", 4))
    np.testing.assert_array_equal(q.array, np.asarray(x.array)[:, :3])


def test_joining_errors():
    a = values((Axis("batch", 2), Axis("pos", 3)), 0)
    with pytest.raises(ValueError, match=r"add up to 4, but it has size 3"):
        hn.split(a, "pos", [2, 2])
    with pytest.raises(
        ValueError, match=r"'batch' has size 2 in \(batch=2, pos=3\) but size 3 in \(batch=3, pos=3\)"
    ):
        hn.concatenate("pos", [a, values((Axis("batch", 3), Axis("pos", 3)), 1)])
    with pytest.raises(ValueError, match="same axis names"):
        hn.stack("layers", [a, values((Axis("batch", 2), Axis("embed", 3)), 1)])
    with pytest.raises(KeyError, match="'vocab' is not among"):
        hn.concatenate("vocab", [a, a])
    with pytest.raises(ValueError, match="already have an axis 'pos'"):
        hn.stack("pos", [a, a])
    with pytest.raises(ValueError, match="add up to 6, not 5"):
        hn.concatenate(Axis("pos", 5), [a, a])


def test_joining_gradients():
    axes = (Axis("batch", 2), Axis("pos", 3))
    x = values(axes, 0)

    def f(raw):
        v = hn.named(raw, axes)
        left, right = hn.split(v, "pos", [1, 2])
        joined = hn.concatenate("pos", [right, hn.tanh(left)])
        return hn.stack("copies", [joined, joined * 2]).array

    check_grads_jitted(f, (x.array,), order=1, modes=("fwd", "rev"))


def test_concatenate_under_jit_with_jnp_values():
    a = hn.named(jnp.ones((2, 1)), ("batch", "pos"))
    b = hn.named(jnp.zeros((2, 2)), ("pos", "batch"))
    out = hn.concatenate("pos", [a, b])
    np.testing.assert_array_equal(out.array, [[1, 0, 0], [1, 0, 0]])
