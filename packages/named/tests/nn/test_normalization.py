"""LayerNorm and RMSNorm against the numpy formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.named import Axis, named
from halyard.named.nn import LayerNorm, RMSNorm

Embed = Axis("embed", 16)
# A norm over n values: its mean (and a layer norm's variance), the square root, the scale and the bias.
NORM_TERMS = 2 * Embed.size + FUNCTION_TERMS + 2


def _norm_bound(x: np.ndarray, axis_size: int, weight=1.0, bias=0.0) -> float:
    """A normalised value's bound: a layer norm's mean cancels down to the spread, so the sums' error at
    ``|x|`` is divided by the smallest standard deviation (1 for an RMS norm's ``|x| / rms``)."""
    rows = x.reshape(-1, axis_size)
    size = np.abs(rows).max() / rows.std(-1).min()
    return summation_tolerance(
        size * np.abs(weight).max() + np.abs(bias).max(), 2 * axis_size + FUNCTION_TERMS + 2
    )


def _input(seed=0, shape=(3, 2, 16)):
    return np.random.default_rng(seed).normal(loc=1.5, scale=2.0, size=shape).astype(np.float32)


def _perturbed(module, seed):
    """The module with random weight / bias so that the affine part is exercised."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: p + rng.normal(size=p.shape).astype(np.float32), module)


def test_layer_norm_matches_numpy_formula_in_any_axis_order():
    norm = _perturbed(LayerNorm.init(Embed, eps=1e-5), 1)
    x = _input()  # (embed is last here, but we hand it first below)
    y = norm(named(np.moveaxis(x, -1, 0), ("embed", "pos", "batch")))
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(var + 1e-5) * np.asarray(norm.weight.array) + np.asarray(norm.bias.array)
    assert y.axis_names == ("embed", "pos", "batch")
    bound = _norm_bound(x, Embed.size, norm.weight.array, norm.bias.array)
    np.testing.assert_allclose(np.asarray(y.unwrap("pos", "batch", "embed")), expected, atol=bound, rtol=0)


def test_layer_norm_without_affine_and_over_two_axes():
    Heads, HeadSize = Axis("heads", 2), Axis("head_size", 8)
    norm = LayerNorm.init((Heads, HeadSize), use_weight=False, use_bias=False)
    assert norm.weight is None and norm.bias is None
    x = _input(shape=(3, 2, 8))
    y = norm(named(x, ("pos", "heads", "head_size")))
    flat = x.reshape(3, 16)
    expected = ((flat - flat.mean(-1, keepdims=True)) / np.sqrt(flat.var(-1, keepdims=True) + 1e-5)).reshape(
        3, 2, 8
    )
    np.testing.assert_allclose(np.asarray(y.array), expected, atol=_norm_bound(x, 16), rtol=0)


def test_rms_norm_matches_numpy_formula_and_optional_bias():
    norm = _perturbed(RMSNorm.init(Embed, eps=1e-6, use_bias=True), 2)
    x = _input(3)
    y = norm(named(x, ("batch", "pos", "embed")))
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * np.asarray(
        norm.weight.array
    ) + np.asarray(norm.bias.array)
    bound = summation_tolerance(expected, NORM_TERMS)  # no cancellation: |x| / rms is at most sqrt(16)
    np.testing.assert_allclose(np.asarray(y.array), expected, atol=bound, rtol=0)
    assert RMSNorm.init(Embed).bias is None


def test_norms_keep_bf16_dtype_and_compute_in_float32():
    x = named(jnp.asarray(_input(4), dtype=jnp.bfloat16), ("batch", "pos", "embed"))
    for norm in (LayerNorm.init(Embed), RMSNorm.init(Embed)):
        y = norm(x)
        assert y.dtype == jnp.bfloat16
        assert np.isfinite(np.asarray(y.array, dtype=np.float32)).all()


def test_norm_gradients_match_plain_jax():
    norm = _perturbed(RMSNorm.init(Embed), 5)
    x = named(_input(6), ("batch", "pos", "embed"))

    def named_loss(n, x):
        return jnp.sum(jnp.sin(n(x).array))

    def plain_loss(w, x):
        return jnp.sum(jnp.sin(x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w))

    g_module, g_x = jax.jit(jax.grad(named_loss, argnums=(0, 1)))(norm, x)
    ref_w, ref_x = jax.grad(plain_loss, argnums=(0, 1))(norm.weight.array, x.array)
    # the norm and the sin forward and backward; the weight's gradient sums the 6 rows
    terms = 2 * (NORM_TERMS + FUNCTION_TERMS) + 6
    bound_w, bound_x = summation_tolerance(ref_w, terms), summation_tolerance(ref_x, terms)
    np.testing.assert_allclose(np.asarray(g_module.weight.array), np.asarray(ref_w), atol=bound_w, rtol=0)
    np.testing.assert_allclose(np.asarray(g_x.array), np.asarray(ref_x), atol=bound_x, rtol=0)


def test_norm_errors_name_the_axis():
    with pytest.raises(KeyError, match="embed"):
        LayerNorm.init(Embed)(named(jnp.ones((2, 16)), ("pos", "hidden")))
    with pytest.raises(ValueError, match="size"):
        RMSNorm.init(Embed)(named(jnp.ones((2, 8)), ("pos", "embed")))
    with pytest.raises(TypeError, match="Axis"):
        RMSNorm.init("embed")
