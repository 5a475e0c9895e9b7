"""int8_dot_general: values and both gradients within the bound absmax_int8's half-step error gives, int8
products in the program, bf16 in and out, the int32 sums never saved by save_dots, and FSDP-style sharding
giving the single device's bits.

The bound. `absmax_int8` gives ``q * s = v - e`` with ``|e| <= s / 2`` in every element. Forward, with
``x = qx sx + ex`` (``sx`` per token) and ``W = qw sw + ew`` (``sw`` per output channel):

    y_q - y = sum_i (x - ex)(W - ew) - x W  =>  |y_q - y| <= sum_i (sx/2 |W| + |x| sw/2 + sx sw / 4)

Input gradient: ``q1 s1 = dy sw + e1`` (``s1`` per token; rounded stochastically, so ``|e1| < s1``: a whole
step), ``qw = (W - ew) / sw``:

    dx_q = sum_o (dy + e1 / sw)(W - ew)  =>  |dx_q - dx| <= sum_o (|dy| sw/2 + s1 / sw |W| + s1 / 2)

Weight gradient: ``q2 s2 = dy sx + e2`` (``s2`` per output channel, ``|e2| < s2``), ``qx = (x - ex) / sx``:

    dW_q = sum_t (x - ex)(dy + e2 / sx)  =>  |dW_q - dW| <= sum_t (sx/2 |dy| + |x| s2 / sx + s2 / 2)

The float32 rescaling adds a few ulps of the result (``FLOAT_SLACK``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from halyard.named.nn import INT8_PROJECTION, absmax_int8, int8_dot_general
from halyard.named.nn.remat import checkpoint_layer

FLOAT_SLACK = 1e-5
TOKENS, IN, OUT = (4, 6), 24, 10
DIMS = (((2,), (0,)), ((), ()))


def operands(dtype: jnp.dtype = jnp.float32) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``x [4, 6, 24]`` with rows of different sizes, ``W [24, 10]`` with columns of different sizes, ``dy``."""
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (*TOKENS, IN)) * jnp.linspace(0.1, 3.0, TOKENS[1])[:, None]
    w = jax.random.normal(kw, (IN, OUT)) * jnp.linspace(0.2, 2.0, OUT)
    dy = jax.random.normal(kg, (*TOKENS, OUT))
    return x.astype(dtype), w.astype(dtype), dy.astype(dtype)


def scale(v: np.ndarray, reduce: tuple[int, ...]) -> np.ndarray:
    return np.asarray(absmax_int8(jnp.asarray(v), reduce)[1], np.float64)


def test_values_and_gradients_are_within_the_derived_bound() -> None:
    x, w, dy = (np.asarray(a, np.float64) for a in operands())
    y, vjp = jax.vjp(lambda a, b: int8_dot_general(a, b, DIMS), *operands()[:2])
    dx, dw = vjp(operands()[2])
    exact_y, exact_dx, exact_dw = x @ w, dy @ w.T, np.einsum("bti,bto->io", x, dy)

    sx, sw = scale(x, (2,)), scale(w, (0,))  # [4, 6, 1], [1, 10]
    y_bound = sx / 2 * np.abs(w).sum(0) + np.abs(x).sum(-1, keepdims=True) * sw / 2 + IN * sx * sw / 4
    s1 = scale(dy * sw, (2,))  # per token, [4, 6, 1]
    dx_bound = (np.abs(dy) * sw / 2).sum(-1, keepdims=True) + s1 * (np.abs(w) / sw).sum(-1) + OUT * s1 / 2
    s2 = scale(dy * sx, (0, 1)).reshape(1, OUT)  # per output channel
    tokens = TOKENS[0] * TOKENS[1]
    dw_bound = (
        np.einsum("bti,bto->io", sx / 2 * np.ones_like(x), np.abs(dy))
        + np.einsum("bti,bt->i", np.abs(x), 1 / sx[..., 0])[:, None] * s2
        + tokens * s2 / 2
    )
    for got, exact, bound, name in (
        (y, exact_y, y_bound, "y"),
        (dx, exact_dx, dx_bound, "dx"),
        (dw, exact_dw, dw_bound, "dW"),
    ):
        error = np.abs(np.asarray(got, np.float64) - exact)
        slack = FLOAT_SLACK * np.abs(exact).max()
        assert np.all(error <= bound + slack), f"{name}: worst excess {np.max(error - bound)}"
        assert error.max() > 0 and bound.max() < 0.1 * np.abs(exact).max(), name  # a real, tight test


def test_the_weight_gradient_keeps_many_small_gradients_next_to_a_few_large_ones() -> None:
    # Every token's gradient pulls W towards the identity by 1/4 of an int8 step of the four outlier tokens'
    # scale. Rounded to nearest they all vanish (dW kept 30% of that pull); rounded stochastically they
    # count in expectation, and the noise of 4,096 tokens averages to a few percent.
    tokens, size = 4096, 16
    kx, ko = jax.random.split(jax.random.key(2))
    x = jax.random.normal(kx, (tokens, size))
    dy = (0.002 * x).at[:4].set(jax.random.normal(ko, (4, size)))
    _, vjp = jax.vjp(lambda a, b: int8_dot_general(a, b, (((1,), (0,)), ((), ()))), x, jnp.eye(size))
    dw = np.asarray(vjp(dy)[1], np.float64)
    exact = np.asarray(x, np.float64).T @ np.asarray(dy, np.float64)
    assert np.linalg.norm(dw - exact) / np.linalg.norm(exact) < 0.15
    assert abs(np.trace(dw) / np.trace(exact) - 1) < 0.02  # unbiased: the small tokens' sum is all there


def test_bfloat16_in_bfloat16_out_and_several_contracted_dimensions() -> None:
    # (heads, head_size) -> embed, the output projection's shape, with the weight's In dims in another order.
    kx, kw, kg = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (3, 5, 4, 8), jnp.bfloat16)
    w = jax.random.normal(kw, (8, 16, 4), jnp.bfloat16)
    dims = (((3, 2), (0, 2)), ((), ()))
    y, vjp = jax.vjp(lambda a, b: int8_dot_general(a, b, dims), x, w)
    dx, dw = vjp(jax.random.normal(kg, (3, 5, 16), jnp.bfloat16))
    assert (y.dtype, dx.dtype, dw.dtype) == (jnp.bfloat16,) * 3
    assert (y.shape, dx.shape, dw.shape) == ((3, 5, 16), x.shape, w.shape)
    float_y, float_vjp = jax.vjp(
        lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32), x, w
    )
    float_dx, float_dw = float_vjp(jax.random.normal(kg, (3, 5, 16), jnp.bfloat16).astype(jnp.float32))
    for got, want in ((y, float_y), (dx, float_dx), (dw, float_dw)):
        relative = jnp.linalg.norm(got.astype(jnp.float32) - want) / jnp.linalg.norm(want)
        assert relative < 0.03  # a few half-steps of 1/127 over the products
    squares = jax.grad(lambda a, b: jnp.sum(int8_dot_general(a, b, dims).astype(jnp.float32) ** 2), (0, 1))
    text = jax.jit(squares).lower(x, w).as_text()
    products = [line for line in text.splitlines() if "dot_general" in line]
    assert len(products) == 3 and all("xi8>, tensor<" in p and "xi32>" in p for p in products), products


def test_save_dots_keeps_the_rescaled_output_and_recomputes_the_same_gradients(
    capsys: pytest.CaptureFixture[str],
) -> None:
    x, w, _ = operands(jnp.bfloat16)

    def layer(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(int8_dot_general(jnp.sin(a), b, DIMS)).astype(jnp.float32))

    capsys.readouterr()
    jax.ad_checkpoint.print_saved_residuals(checkpoint_layer(layer, "save_dots"), x, w)
    saved = capsys.readouterr().out.splitlines()  # "bf16[4,6,10] named 'int8_projection' from ..."
    assert not any(line.startswith("i32") for line in saved), saved
    assert any(line.startswith(f"bf16[4,6,10] named '{INT8_PROJECTION}'") for line in saved), saved
    for remat in ("save_dots", "full", "offload"):
        got = jax.jit(jax.grad(checkpoint_layer(layer, remat), (0, 1)))(x, w)
        want = jax.jit(jax.grad(layer, (0, 1)))(x, w)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=remat)


def test_sharded_over_eight_devices_it_gives_the_single_devices_bits() -> None:
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices")
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "fsdp"))
    x, w, dy = operands(jnp.bfloat16)
    x = jnp.tile(x, (2, 1, 1))  # 8 rows: split over data x fsdp
    dy = jnp.tile(dy, (2, 1, 1))

    def step(a: jax.Array, b: jax.Array, g: jax.Array) -> tuple[jax.Array, ...]:
        y, vjp = jax.vjp(lambda a, b: int8_dot_general(a, b, DIMS), a, b)
        return (y, *vjp(g))

    whole = jax.jit(step)(x, w, dy)
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    weight = NamedSharding(mesh, PartitionSpec("fsdp"))  # the contracted dimension split, as FSDP splits it
    sharded = jax.jit(step)(jax.device_put(x, rows), jax.device_put(w, weight), jax.device_put(dy, rows))
    for a, b in zip(sharded, whole, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_a_contraction_with_batch_dimensions_is_refused() -> None:
    x, w = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
    with pytest.raises(ValueError, match="int8_dot_general quantizes a projection"):
        int8_dot_general(x, w, (((2,), (1,)), ((0,), (0,))))
