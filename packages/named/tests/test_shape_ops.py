"""rename, axis order, pad / roll / flip by name, against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from named_strategies import axis_pools, check_grads_jitted, seeds, subsets, values

import halyard.named as hn
from halyard.named import Axis


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_rearrange_axes_and_unwrap(data, pool, seed):
    x = values(data.draw(st.permutations(pool)), seed)
    order = data.draw(st.permutations(x.axis_names))
    out = x.rearrange(*order)
    assert out.axis_names == tuple(order)
    np.testing.assert_array_equal(
        out.array, np.transpose(np.asarray(x.array), [x.axis_names.index(n) for n in order])
    )
    np.testing.assert_array_equal(x.unwrap(*order), out.array)
    front = data.draw(subsets(x.axes))
    moved = x.rearrange(*[a.name for a in front], ...)
    assert moved.axes == tuple(front) + tuple(a for a in x.axes if a not in front)


def test_rename():
    x = values((Axis("pos", 3), Axis("embed", 2)), 0)
    out = x.rename({"pos": "key_pos", Axis("embed", 2): Axis("hidden", 2)})
    assert out.axes == (Axis("key_pos", 3), Axis("hidden", 2))
    np.testing.assert_array_equal(out.array, x.array)
    with pytest.raises(KeyError, match="'heads' is not among"):
        x.rename({"heads": "h"})
    with pytest.raises(ValueError, match="sizes differ"):
        x.rename({"pos": Axis("key_pos", 4)})
    with pytest.raises(ValueError, match="'embed' repeats"):
        x.rename({"pos": "embed"})


@given(
    data=st.data(),
    pool=axis_pools(),
    seed=seeds,
    mode=st.sampled_from(["constant", "edge", "wrap"]),
)
def test_pad_by_name(data, pool, seed, mode):
    x = values(data.draw(st.permutations(pool)), seed)
    padded = data.draw(subsets(x.axes))
    widths = {a.name: (data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for a in padded}
    out = hn.pad(x, widths, mode=mode, constant_value=-7.0)
    numpy_widths = [widths.get(a.name, (0, 0)) for a in x.axes]
    kwargs = {"constant_values": -7.0} if mode == "constant" else {}
    np.testing.assert_array_equal(out.array, np.pad(np.asarray(x.array), numpy_widths, mode=mode, **kwargs))
    assert out.axis_names == x.axis_names


@given(data=st.data(), pool=axis_pools(), seed=seeds, shift=st.integers(-4, 4))
def test_roll_and_flip(data, pool, seed, shift):
    x = values(data.draw(st.permutations(pool)), seed)
    axis = data.draw(st.sampled_from(x.axis_names))
    k = x.axis_names.index(axis)
    np.testing.assert_array_equal(hn.roll(x, shift, axis).array, np.roll(np.asarray(x.array), shift, axis=k))
    np.testing.assert_array_equal(hn.flip(x, axis).array, np.flip(np.asarray(x.array), axis=k))
    traced = jax.jit(lambda v, s: hn.roll(v, s, axis))(x, shift)
    np.testing.assert_array_equal(traced.array, np.roll(np.asarray(x.array), shift, axis=k))


def test_pad_errors_and_gradient():
    axes = (Axis("batch", 2), Axis("pos", 3))
    x = values(axes, 0)
    with pytest.raises(ValueError, match="widths must be >= 0"):
        hn.pad(x, {"pos": (-1, 0)})
    with pytest.raises(KeyError, match="'embed' is not among"):
        hn.pad(x, {"embed": 1})
    assert hn.pad(x, {"pos": 2}).axis_size("pos") == 7
    check_grads_jitted(
        lambda raw: hn.roll(hn.pad(hn.named(raw, axes), {"pos": (1, 2)}), 1, "pos").array * jnp.arange(6.0),
        (x.array,),
        modes=("fwd", "rev"),
    )
