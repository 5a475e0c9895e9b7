"""Property tests: layers give the same numbers whatever the order of the input's axes."""

import jax
import numpy as np
from float_tolerance import FUNCTION_TERMS, summation_tolerance
from hypothesis import given, settings
from hypothesis import strategies as st

from halyard.named import Axis, named
from halyard.named.nn import LayerNorm, Linear, RMSNorm

SIZES = {"batch": 2, "pos": 3, "heads": 2, "head_size": 3, "embed": 4}


@settings(max_examples=10, deadline=None)
@given(
    order=st.permutations(["batch", "pos", "heads", "head_size"]),
    seed=st.integers(0, 2**16),
)
def test_linear_over_two_input_axes_matches_numpy_einsum_in_any_order(order, seed):
    layer = Linear.init(
        (Axis("heads", 2), Axis("head_size", 3)), Axis("embed", 4), key=jax.random.PRNGKey(seed)
    )
    rng = np.random.default_rng(seed)
    x = rng.normal(size=tuple(SIZES[n] for n in order)).astype(np.float32)
    y = layer(named(x, tuple(order)))
    assert y.axis_names == (*[n for n in order if n in ("batch", "pos")], "embed")
    canonical = np.transpose(x, [order.index(n) for n in ("batch", "pos", "heads", "head_size")])
    expected = np.einsum("bphd,hde->bpe", canonical, np.asarray(layer.weight.array)) + np.asarray(
        layer.bias.array
    )
    # float32 in both: the 6 products over heads x head_size and the bias, at the addends' size
    addends = np.einsum("bphd,hde->bpe", np.abs(canonical), np.abs(np.asarray(layer.weight.array))) + np.abs(
        np.asarray(layer.bias.array)
    )
    bound = summation_tolerance(addends, 6 + 1)
    np.testing.assert_allclose(np.asarray(y.unwrap("batch", "pos", "embed")), expected, atol=bound, rtol=0)


@settings(max_examples=10, deadline=None)
@given(order=st.permutations(["batch", "pos", "embed"]), seed=st.integers(0, 2**16))
def test_norms_commute_with_transposition(order, seed):
    x = np.random.default_rng(seed).normal(size=(2, 3, 4)).astype(np.float32)
    reference = named(x, ("batch", "pos", "embed"))
    permuted = reference.rearrange(*order)
    for norm in (LayerNorm.init(Axis("embed", 4)), RMSNorm.init(Axis("embed", 4))):
        expected = np.asarray(norm(reference).array)
        # the mean and the squares' mean over 4 in another order (they cancel: at the inputs' size, over the
        # deviation's), the rsqrt, the products, the bias
        spread = float(np.abs(x).max() / np.std(x, axis=-1).min())
        bound = summation_tolerance(np.abs(expected).max() * (1 + spread), 2 * 4 + FUNCTION_TERMS + 3)
        np.testing.assert_allclose(
            np.asarray(norm(permuted).unwrap("batch", "pos", "embed")), expected, atol=bound, rtol=0
        )
