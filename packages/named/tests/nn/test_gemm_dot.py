"""gemm_dot_general: same values and gradients as jax.lax.dot_general; Linear uses it on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.named import Axis, named
from halyard.named.nn import Linear, default_dot_general, gemm_dot_general

CASES = [
    # (lhs shape, rhs shape, lhs contracting, rhs contracting)
    ((6, 4), (4, 9), (1,), (0,)),  # k < o: dW from a transposed x
    ((6, 9), (9, 4), (1,), (0,)),  # k > o: dW from a transposed dy
    ((2, 3, 8), (8, 5), (2,), (0,)),  # batch and position kept
    ((3, 8, 2), (8, 5), (1,), (0,)),  # contracted axis in the middle of x
    ((2, 3, 2, 4), (2, 4, 8), (2, 3), (0, 1)),  # two contracted axes (heads, head_size -> embed)
    ((2, 3, 4, 2), (2, 4, 8), (3, 2), (0, 1)),  # contracted axes in another order than the weight's
    ((2, 3, 8), (5, 8), (2,), (1,)),  # weight stored [out, in]
    ((2, 3, 8), (8, 2, 4), (2,), (0,)),  # two free weight axes (embed -> heads, head_size)
]


def _inputs(lhs_shape, rhs_shape, dtype=jnp.float32):
    rng = np.random.default_rng(sum(lhs_shape) * 31 + sum(rhs_shape))
    return jnp.asarray(rng.normal(size=lhs_shape), dtype), jnp.asarray(rng.normal(size=rhs_shape), dtype)


@pytest.mark.parametrize(("lhs_shape", "rhs_shape", "lhs_contract", "rhs_contract"), CASES)
def test_values_and_gradients_match_dot_general(lhs_shape, rhs_shape, lhs_contract, rhs_contract):
    x, w = _inputs(lhs_shape, rhs_shape)
    dims = ((lhs_contract, rhs_contract), ((), ()))
    probe = jnp.asarray(np.random.default_rng(7).normal(size=jax.lax.dot_general(x, w, dims).shape))

    def loss(dot):
        return lambda x, w: jnp.sum(jnp.sin(dot(x, w, dims)) * probe)

    # two programs: the product's contracted terms at the addends' size (they cancel); the gradients add
    # the sin and the backward products' sums, over the other operand's free axes
    contracted = int(np.prod([lhs_shape[axis] for axis in lhs_contract]))
    addends = jax.lax.dot_general(jnp.abs(x), jnp.abs(w), dims)
    bound = summation_tolerance(addends, contracted)
    np.testing.assert_allclose(
        gemm_dot_general(x, w, dims), jax.lax.dot_general(x, w, dims), atol=bound, rtol=0
    )
    got = jax.jit(jax.grad(loss(gemm_dot_general), argnums=(0, 1)))(x, w)
    want = jax.grad(loss(jax.lax.dot_general), argnums=(0, 1))(x, w)
    terms = contracted + (x.size + w.size) // contracted + 2 * FUNCTION_TERMS
    for g, e in zip(got, want, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, atol=summation_tolerance(e, terms), rtol=0)


def test_gradients_are_row_major_products_behind_barriers():
    """The backward pass holds only [n, k] x [k, o] products and materialised transposes."""
    x, w = _inputs((16, 4), (4, 32))
    dims = (((1,), (0,)), ((), ()))
    grad = jax.grad(lambda x, w: gemm_dot_general(x, w, dims).sum(), argnums=(0, 1))
    equations = list(_equations(jax.make_jaxpr(grad)(x, w).jaxpr))
    assert any(e.primitive.name == "optimization_barrier" for e in equations)
    dots = [e.params["dimension_numbers"] for e in equations if e.primitive.name == "dot_general"]
    assert len(dots) == 3  # forward, dx, dW
    assert all(d == (((1,), (0,)), ((), ())) for d in dots), dots


def _equations(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs nested in its equations' parameters."""
    for equation in jaxpr.eqns:
        yield equation
        for value in equation.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield from _equations(inner)


def test_bfloat16_gradients_keep_their_dtype():
    x, w = _inputs((8, 4), (4, 6), jnp.bfloat16)
    dims = (((1,), (0,)), ((), ()))
    gx, gw = jax.grad(lambda x, w: gemm_dot_general(x, w, dims).astype(jnp.float32).sum(), argnums=(0, 1))(
        x, w
    )
    assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(gw, np.float32), np.asarray(x.T.astype(jnp.float32) @ jnp.ones((8, 6))), rtol=2e-2
    )


def test_batch_dimensions_and_keywords_fall_back_to_dot_general():
    x, w = _inputs((3, 4, 5), (3, 5, 2))
    dims = (((2,), (1,)), ((0,), (0,)))
    # the fallback is dot_general itself: the same values bit for bit
    np.testing.assert_array_equal(gemm_dot_general(x, w, dims), jax.lax.dot_general(x, w, dims))
    text = str(jax.make_jaxpr(jax.grad(lambda x: gemm_dot_general(x, w, dims).sum()))(x))
    assert "optimization_barrier" not in text
    x2, w2 = _inputs((4, 5), (5, 2))
    out = gemm_dot_general(x2, w2, (((1,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(out, x2 @ w2, atol=summation_tolerance(jnp.abs(x2) @ jnp.abs(w2), 5), rtol=0)


def test_zero_size_dimensions_fall_back_to_dot_general():
    dims = (((1,), (0,)), ((), ()))
    for lhs_shape, rhs_shape in (((0, 4), (4, 3)), ((2, 0), (0, 3))):
        x, w = jnp.ones(lhs_shape), jnp.ones(rhs_shape)
        out = gemm_dot_general(x, w, dims)
        np.testing.assert_array_equal(out, jax.lax.dot_general(x, w, dims))
        gx, gw = jax.grad(lambda x, w: gemm_dot_general(x, w, dims).sum(), argnums=(0, 1))(x, w)
        assert gx.shape == lhs_shape and gw.shape == rhs_shape


def test_preferred_element_type_for_an_unembedding_weight():
    """bf16 hidden states times a [vocab, embed] weight into f32 logits (the loss's product)."""
    hidden, weight = _inputs((12, 8), (20, 8), jnp.bfloat16)
    dims = (((1,), (1,)), ((), ()))

    def loss(dot):
        return lambda h, w: jnp.sum(jax.nn.logsumexp(dot(h, w, dims, preferred_element_type=jnp.float32), -1))

    logits = gemm_dot_general(hidden, weight, dims, preferred_element_type=jnp.float32)
    assert logits.dtype == jnp.float32
    # gemm's fallback is dot_general itself: the same program, bit for bit
    np.testing.assert_array_equal(
        logits, jax.lax.dot_general(hidden, weight, dims, preferred_element_type=jnp.float32)
    )
    got = jax.jit(jax.grad(loss(gemm_dot_general), argnums=(0, 1)))(hidden, weight)
    want = jax.grad(loss(jax.lax.dot_general), argnums=(0, 1))(hidden, weight)
    for g, e in zip(got, want, strict=True):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(e, np.float32), rtol=2e-2, atol=2e-2)


def test_linear_uses_the_gemm_dot_on_cpu_and_can_opt_out():
    Embed, Mlp = Axis("embed", 8), Axis("mlp", 5)
    x = named(np.random.default_rng(3).normal(size=(2, 3, 8)).astype(np.float32), ("batch", "pos", "embed"))
    default = Linear.init(Embed, Mlp, key=jax.random.PRNGKey(0))
    plain = Linear.init(Embed, Mlp, key=jax.random.PRNGKey(0), dot_general=jax.lax.dot_general)
    assert default.dot_general is default_dot_general

    def weight_grad(layer):
        return jax.grad(
            lambda w: (
                layer.__class__(w, layer.bias, layer.In, layer.Out, layer.dot_general)(x).array ** 2
            ).sum()
        )

    jaxpr = str(jax.make_jaxpr(weight_grad(default))(default.weight))
    assert ("optimization_barrier" in jaxpr) == (jax.default_backend() == "cpu")
    assert "optimization_barrier" not in str(jax.make_jaxpr(weight_grad(plain))(plain.weight))
    want = weight_grad(plain)(plain.weight).array
    # two programs: the 8 products and the square, forward and backward, the 6 rows summed
    bound = summation_tolerance(want, 2 * (8 + 1) + 6)
    np.testing.assert_allclose(weight_grad(default)(default.weight).array, want, atol=bound, rtol=0)
