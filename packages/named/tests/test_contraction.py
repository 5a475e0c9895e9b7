"""dot and einsum by name, against numpy on random axes and orders."""

import string

import numpy as np
import pytest
from float_tolerance import summation_tolerance
from hypothesis import given
from hypothesis import strategies as st
from named_strategies import axis_pools, check_grads_jitted, numpy_aligned, seeds, subsets, values

import halyard.named as hn
from halyard.named import Axis


def union(*arrays):
    result = []
    for x in arrays:
        result.extend(a for a in x.axes if a not in result)
    return tuple(result)


@given(data=st.data(), pool=axis_pools(min_axes=1, max_axes=4), seed=seeds)
def test_dot_is_multiply_then_sum(data, pool, seed):
    a = values(data.draw(subsets(pool)), seed)
    b = values(data.draw(subsets(pool)), seed + 1)
    everything = union(a, b)
    contracted = data.draw(subsets(everything)) if everything else ()
    out = hn.dot(a, b, axis=tuple(c.name for c in contracted))
    kept = tuple(x for x in everything if x not in contracted)
    assert out.axes == kept
    product = numpy_aligned(a, everything).astype(np.float64) * numpy_aligned(b, everything)
    product = np.broadcast_to(product, tuple(x.size for x in everything))
    positions = tuple(everything.index(c) for c in contracted)
    # the contracted terms (and the product's rounding) at the size of the addends, which cancel
    terms = int(np.prod([c.size for c in contracted])) + 1
    bound = summation_tolerance(np.abs(product).sum(axis=positions), terms)
    np.testing.assert_allclose(out.array, product.sum(axis=positions), atol=bound, rtol=0)


@given(data=st.data(), pool=axis_pools(min_axes=1, max_axes=4), seed=seeds)
def test_dot_with_out_axes_and_all_axes(data, pool, seed):
    a = values(data.draw(subsets(pool, min_size=1)), seed)
    b = values(data.draw(st.permutations(a.axes)), seed + 1)
    full = hn.dot(a, b, axis=None)
    assert full.axes == ()
    aligned_b = np.transpose(np.asarray(b.array), [b.axis_names.index(n) for n in a.axis_names])
    product = np.asarray(a.array, np.float64) * aligned_b
    bound = summation_tolerance(np.abs(product).sum(), product.size + 1)
    np.testing.assert_allclose(full.array, product.sum(), atol=bound, rtol=0)
    order = data.draw(st.permutations(a.axes))
    outer = hn.dot(a, b, axis=(), out_axes=[x.name for x in order])
    assert outer.axes == tuple(order)


@given(data=st.data(), pool=axis_pools(min_axes=2, max_axes=4), seed=seeds)
def test_einsum_matches_numpy(data, pool, seed):
    a = values(data.draw(subsets(pool, min_size=1)), seed)
    b = values(data.draw(subsets(pool, min_size=1)), seed + 1)
    everything = union(a, b)
    out_axes = data.draw(subsets(everything))
    # Terms list the operands' names in a random order: matching is by name.
    term_a = data.draw(st.permutations(a.axis_names))
    term_b = data.draw(st.permutations(b.axis_names))
    spec = f"{' '.join(term_a)}, {' '.join(term_b)} -> {' '.join(x.name for x in out_axes)}"
    out = hn.einsum(spec, a, b)
    assert out.axes == tuple(out_axes)
    letters = {x.name: string.ascii_lowercase[i] for i, x in enumerate(everything)}
    numpy_spec = (
        "".join(letters[n] for n in a.axis_names)
        + ","
        + "".join(letters[n] for n in b.axis_names)
        + "->"
        + "".join(letters[x.name] for x in out_axes)
    )
    expected = np.einsum(numpy_spec, np.asarray(a.array, np.float64), np.asarray(b.array, np.float64))
    addends = np.einsum(
        numpy_spec, np.abs(np.asarray(a.array, np.float64)), np.abs(np.asarray(b.array, np.float64))
    )
    terms = int(np.prod([x.size for x in everything if x not in out_axes])) + 1
    np.testing.assert_allclose(out.array, expected, atol=summation_tolerance(addends, terms), rtol=0)


def test_dot_of_three_operands_and_precision_arguments():
    Batch, Embed, Mlp = Axis("batch", 2), Axis("embed", 3), Axis("mlp", 4)
    x, w, scale = values((Batch, Embed), 0), values((Mlp, Embed), 1), values((Mlp,), 2)
    out = hn.dot(x, w, scale, axis="embed", preferred_element_type=np.float32)
    expected = np.einsum("be,me,m->bm", x.array, w.array, scale.array)
    addends = np.einsum("be,me,m->bm", *(np.abs(np.asarray(v.array)) for v in (x, w, scale)))
    np.testing.assert_allclose(out.array, expected, atol=summation_tolerance(addends, 3 + 2), rtol=0)


def test_contraction_gradients():
    Batch, Embed, Mlp = Axis("batch", 2), Axis("embed", 3), Axis("mlp", 4)
    x, w = values((Batch, Embed), 0), values((Mlp, Embed), 1)

    def f(raw_x, raw_w):
        xn, wn = hn.named(raw_x, (Batch, Embed)), hn.named(raw_w, (Mlp, Embed))
        return (hn.dot(xn, wn, axis="embed") + hn.einsum("batch embed, mlp embed -> mlp", xn, wn)).array

    check_grads_jitted(f, (x.array, w.array), order=2, modes=("fwd", "rev"))


def test_contraction_errors():
    x = values((Axis("batch", 2), Axis("embed", 3)), 0)
    w = values((Axis("embed", 4), Axis("mlp", 5)), 1)
    with pytest.raises(
        ValueError, match=r"'embed' has size 3 in \(batch=2, embed=3\) but size 4 in \(embed=4, mlp=5\)"
    ):
        hn.dot(x, w, axis="embed")
    with pytest.raises(ValueError, match="'heads' is in none of the operands"):
        hn.dot(x, x, axis="heads")
    with pytest.raises(ValueError, match="does not name exactly the axes of operand 0"):
        hn.einsum("batch pos, embed -> batch", x, x.sum("batch"))
    with pytest.raises(ValueError, match="2 input terms but 1 arrays"):
        hn.einsum("batch embed, embed -> batch", x)
    with pytest.raises(ValueError, match="needs '->'"):
        hn.einsum("batch embed", x)
    with pytest.raises(ValueError, match="output axis 'vocab' is in none"):
        hn.einsum("batch embed -> vocab", x)
