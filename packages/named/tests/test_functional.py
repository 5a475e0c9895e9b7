"""vmap / scan / fold over named axes, against jax.vmap / jax.lax.scan on the raw arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

import halyard.named as hn
from halyard.named import Axis, NamedArray

Batch, Pos, Embed, Layers = Axis("batch", 3), Axis("pos", 4), Axis("embed", 5), Axis("layers", 6)
Hidden = Embed.alias("hidden")


def test_vmap_maps_by_name_whatever_the_position():
    x = hn.random.normal(jax.random.key(0), (Pos, Batch, Embed))
    bias = hn.random.normal(jax.random.key(1), Embed)
    seen = []

    def center(row: NamedArray, b: NamedArray) -> NamedArray:
        seen.append(row.axis_names)
        return row - row.mean("embed") + b

    out = hn.vmap(center, "batch")(x, bias)
    assert seen == [("pos", "embed")]
    assert out.axes == (Batch, Pos, Embed)
    raw = np.asarray(x.unwrap("batch", "pos", "embed"))
    expected = raw - raw.mean(-1, keepdims=True) + np.asarray(bias.array)
    # numpy's mean of 5 in its order, the difference and the bias, at the addends' size (they cancel)
    bound = summation_tolerance(2 * np.abs(raw).max() + np.abs(np.asarray(bias.array)).max(), Embed.size + 2)
    np.testing.assert_allclose(out.array, expected, atol=bound, rtol=0)


def test_vmap_axis_name_is_the_collective_name_and_plain_arrays():
    x = hn.arange(Batch, dtype=jnp.float32)

    def share(v: NamedArray, key: jax.Array) -> tuple[NamedArray, jax.Array]:
        return v / jax.lax.psum(v.array, "batch"), jax.random.normal(key, ())

    keys = jax.random.split(jax.random.key(0), 3)
    out, noise = hn.vmap(share, "batch", unnamed_axis=0)(x, keys)
    # 0 + 1 + 2 is exact, each quotient one float32 rounding from float64's
    np.testing.assert_allclose(out.array, np.arange(3) / 3.0, rtol=float(np.finfo(np.float32).eps), atol=0)
    assert noise.shape == (3,) and len(set(np.asarray(noise).tolist())) == 3


def test_vmap_with_an_axis_no_argument_has():
    key = jax.random.key(0)
    out = hn.vmap(lambda: hn.random.normal(key, Embed), Layers)()
    assert out.axes == (Layers, Embed)
    with pytest.raises(ValueError, match="no argument has axis 'layers'"):
        hn.vmap(lambda: hn.zeros(Embed), "layers")()


def test_vmap_size_clash_names_the_axes():
    a = hn.zeros((Batch, Embed))
    b = hn.zeros((Batch.resize(4), Pos))
    with pytest.raises(ValueError, match=r"axis 'batch' must have one size.*batch=3.*batch=4"):
        hn.vmap(lambda u, v: u, "batch")(a, b)


def _block(h: NamedArray, weight: NamedArray) -> NamedArray:
    return hn.tanh(hn.dot(h, weight, axis="embed").rename({"hidden": "embed"}))


def _stack():
    key1, key2 = jax.random.split(jax.random.key(0))
    weights = hn.random.normal(key1, (Embed, Layers, Hidden)) * 0.5  # layers axis in the middle on purpose
    h = hn.random.normal(key2, (Batch, Embed))
    return h, weights


def _reference(h, weights):
    raw_h = np.asarray(h.unwrap("batch", "embed"))
    raw_w = np.asarray(weights.unwrap("layers", "embed", "hidden"))
    outs = []
    for w in raw_w:
        outs.append(raw_h.sum())
        raw_h = np.tanh(raw_h @ w)
    return raw_h, np.array(outs)


@pytest.mark.parametrize("remat", [None, True, jax.checkpoint_policies.dots_saveable])
def test_scan_equals_the_unrolled_loop(remat):
    h, weights = _stack()

    def step(carry, w):
        assert w.axis_names == ("embed", "hidden")
        return _block(carry, w), carry.sum()

    carry, ys = hn.scan(step, "layers", remat=remat)(h, weights)
    expected_carry, expected_ys = _reference(h, weights)
    assert carry.axes == (Batch, Embed) and ys.axes == (Layers,)
    # numpy's float32 layers: a dot product (addends up to |h| |w|, 5 of them) and a tanh each; a layer's
    # input summed (3 x 5 values, within 1 after the first layer, of both signs)
    forward = Layers.size * (Embed.size + FUNCTION_TERMS)
    largest = max(np.abs(np.asarray(h.array)).max(), 1.0)
    dot = largest * np.abs(np.asarray(weights.array)).max() * Embed.size
    np.testing.assert_allclose(carry.array, expected_carry, atol=summation_tolerance(dot, forward), rtol=0)
    inputs = largest * Batch.size * Embed.size
    np.testing.assert_allclose(ys.array, expected_ys, atol=summation_tolerance(inputs, forward + 15), rtol=0)


@pytest.mark.parametrize("remat", [None, True, jax.checkpoint_policies.nothing_saveable])
def test_fold_gradients_equal_the_unrolled_loop(remat):
    h, weights = _stack()

    def loss_fold(w):
        return hn.fold(_block, "layers", remat=remat)(h, w).sum().array

    def loss_loop(w):
        carry = h
        for i in range(Layers.size):
            carry = _block(carry, w["layers", i])
        return carry.sum().array

    g_fold = jax.jit(jax.grad(loss_fold))(weights)
    g_loop = jax.grad(loss_loop)(weights)
    assert g_fold.axes == weights.axes
    # two programs: the forward and backward passes and the final sum's 15 terms
    bound = summation_tolerance(
        g_loop.array, 2 * Layers.size * (Embed.size + FUNCTION_TERMS) + 15 + Batch.size
    )
    np.testing.assert_allclose(g_fold.array, g_loop.array, atol=bound, rtol=0)


def test_scan_reverse_and_pytrees_of_xs():
    xs = {"value": hn.arange(Layers, dtype=jnp.float32), "scale": jnp.arange(6.0)}
    const = hn.full(Embed, 2.0)

    def step(total, item, broadcast):
        assert broadcast.axes == (Embed,)
        new = total + (item["value"] * item["scale"]).array
        return new, {"running": new, "seen": item["value"]}

    total, ys = hn.scan(step, "layers", reverse=True)(jnp.float32(0), xs, const)
    # small integers: their products and sums are exact in float32
    np.testing.assert_array_equal(total, float(np.sum(np.arange(6.0) ** 2)))
    running = np.cumsum((np.arange(6.0) ** 2)[::-1])[::-1]
    np.testing.assert_array_equal(ys["running"], running)
    assert ys["seen"].axes == (Layers,)


def test_scan_with_only_an_axis_is_a_loop():
    total, ys = hn.scan(lambda c: (c + 1, c), Layers)(jnp.int32(0))
    assert int(total) == 6 and ys.shape == (6,)


def test_scan_remat_policy_must_be_valid():
    h, weights = _stack()
    with pytest.raises(TypeError, match="remat must be"):
        hn.fold(_block, "layers", remat="full")(h, weights)


def test_vmap_keywords_nesting_and_static_outputs():
    x = hn.random.normal(jax.random.key(0), (Batch, Pos, Embed))
    bias = hn.random.normal(jax.random.key(1), (Pos,))

    def inner(row, *, shift):
        return {"total": row.sum("embed") + shift, "label": "per-row"}

    twice = hn.vmap(hn.vmap(inner, "pos"), "batch")
    out = twice(x, shift=bias)
    assert out["label"] == "per-row"
    assert out["total"].axes == (Batch, Pos)
    expected = np.asarray(x.array).sum(-1) + np.asarray(bias.array)[None, :]
    addends = np.abs(np.asarray(x.array)).sum(-1) + np.abs(np.asarray(bias.array))[None, :]
    np.testing.assert_allclose(
        out["total"].array, expected, atol=summation_tolerance(addends, Embed.size + 1), rtol=0
    )


def test_scan_can_broadcast_plain_arrays():
    table = jnp.arange(4.0)  # passed whole to every step with unnamed_axis=None

    def step(total, index, lookup):
        return total + lookup[index.array], None

    total, _ = hn.scan(step, "layers", unnamed_axis=None)(jnp.float32(0), hn.arange(Axis("layers", 3)), table)
    assert float(total) == 0 + 1 + 2
