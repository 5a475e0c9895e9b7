"""NamedArray as a pytree under jit, grad, jax.vmap (with hn.vmap), lax.scan, checkpoint and eqx."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from float_tolerance import FUNCTION_TERMS, summation_tolerance

import halyard.named as hn
from halyard.named import Axis, NamedArray

Batch, Embed, Mlp = Axis("batch", 3), Axis("embed", 4), Axis("mlp", 5)


def params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"w": hn.random.normal(k1, (Embed, Mlp)), "b": hn.random.normal(k2, Mlp)}


def model(p, x: NamedArray) -> NamedArray:
    return hn.tanh(hn.dot(x, p["w"], axis="embed") + p["b"])


def model_raw(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def model_sizes(p, x: np.ndarray) -> np.ndarray:
    """The size of what tanh(x @ w + b) adds up, row by row (at least 1, tanh's bound): a rounding of the
    tanh's argument moves the tanh by at most as much (its slope is at most 1)."""
    raw = {k: np.abs(np.asarray(v.array, np.float64)) for k, v in p.items()}
    return np.maximum(np.abs(np.asarray(x, np.float64)) @ raw["w"] + raw["b"], 1.0)


# the model's sums: the dot over embed, the bias, the tanh
MODEL_TERMS = Embed.size + 1 + FUNCTION_TERMS


def test_flatten_round_trip_keeps_axes():
    x = hn.random.normal(jax.random.key(1), (Batch, Embed))
    leaves, treedef = jax.tree_util.tree_flatten(x)
    assert len(leaves) == 1 and leaves[0] is x.array
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert again.axes == x.axes
    doubled = jax.tree_util.tree_map(lambda v: v * 2, x)
    assert isinstance(doubled, NamedArray) and doubled.axes == x.axes


def test_jit_and_grad_match_plain_jax():
    p = params()
    x = hn.random.normal(jax.random.key(1), (Batch, Embed))
    raw_p = {k: v.array for k, v in p.items()}

    def loss(p):
        return hn.sum(model(p, x) ** 2).array

    grads = jax.jit(jax.grad(loss))(p)
    # Both compiled whole (XLA's fusion then computes tanh and the sums alike on both sides).
    raw_grads = jax.jit(jax.grad(lambda q: jnp.sum(model_raw(q, x.array) ** 2)))(raw_p)
    assert grads["w"].axes == (Embed, Mlp) and grads["b"].axes == (Mlp,)
    # Two programs: the forward's sums, the loss's 2 out (1 - tanh^2) (a slope at most 2 in tanh), the same
    # products going back and the sum over the batch, whose addends are up to 2 |x| sizes in size.
    sizes = 2 * model_sizes(p, x.array).max(axis=1)
    terms = 2 * MODEL_TERMS + 4 + Batch.size
    w_bound = summation_tolerance(np.abs(np.asarray(x.array)).T @ sizes, terms)
    np.testing.assert_allclose(grads["w"].array, raw_grads["w"], atol=w_bound, rtol=0)
    np.testing.assert_allclose(
        grads["b"].array, raw_grads["b"], atol=summation_tolerance(sizes.sum(), terms), rtol=0
    )
    out = jax.jit(model)(p, x)
    assert out.axes == (Batch, Mlp)


def test_value_and_grad_with_respect_to_a_named_input():
    x = hn.random.normal(jax.random.key(1), (Batch, Embed))
    value, grad = jax.value_and_grad(lambda v: hn.logsumexp(v, ("batch", "embed")).array)(x)
    # hn.logsumexp is jax.nn.logsumexp over both axes, here all of them: the same reduction
    np.testing.assert_array_equal(value, jax.nn.logsumexp(x.array))
    # its gradient, exp(x - max) / sum or exp(x - lse), against softmax, relative entry by entry: the exp's
    # argument rounds by up to |x - lse| eps, the exp's own error, 12 positive addends, a division
    spread = float(np.max(np.abs(np.asarray(x.array) - np.asarray(value))))
    relative = summation_tolerance(1.0 + spread, Batch.size * Embed.size + FUNCTION_TERMS + 2)
    expected = jax.nn.softmax(x.array.reshape(-1)).reshape(3, 4)
    np.testing.assert_allclose(grad.array, expected, rtol=relative, atol=0)


def test_hn_vmap_equals_jax_vmap_on_raw_arrays():
    p = params()
    x = hn.random.normal(jax.random.key(1), (Embed, Batch))  # batch last: vmap finds it by name
    out = hn.vmap(model, "batch")(p, x)
    expected = jax.vmap(model_raw, in_axes=(None, 1))({k: v.array for k, v in p.items()}, x.array)
    assert out.axes == (Batch, Mlp)
    bound = summation_tolerance(model_sizes(p, x.array.T), MODEL_TERMS)
    np.testing.assert_allclose(out.array, expected, atol=bound, rtol=0)


def test_lax_scan_and_checkpoint_with_named_carry():
    p = params()
    Steps = Axis("steps", 4)
    xs = hn.random.normal(jax.random.key(2), (Steps, Batch, Embed))

    @jax.checkpoint
    def step(total, x_raw):
        x = hn.named(x_raw, (Batch, Embed))
        return total + model(p, x), None

    total, _ = jax.lax.scan(step, hn.zeros((Batch, Mlp)), xs.array)
    expected = sum(model_raw({k: v.array for k, v in p.items()}, xs.array[i]) for i in range(4))
    assert total.axes == (Batch, Mlp)
    # each step's model, then the sum of 4 steps' outputs
    sizes = sum(model_sizes(p, xs.array[i]) for i in range(Steps.size))
    bound = summation_tolerance(sizes, MODEL_TERMS + Steps.size)
    np.testing.assert_allclose(total.array, expected, atol=bound, rtol=0)


def test_equinox_modules_hold_named_arrays():
    class Layer(eqx.Module):
        weight: NamedArray

        def __call__(self, x: NamedArray) -> NamedArray:
            return hn.dot(x, self.weight, axis="embed")

    layer = Layer(hn.ones((Embed, Mlp)))
    x = hn.ones((Batch, Embed))
    grads = eqx.filter_grad(lambda m: m(x).sum().array)(layer)
    assert grads.weight.axes == (Embed, Mlp)
    np.testing.assert_array_equal(grads.weight.array, np.full((4, 5), 3.0))  # sums of ones: exact
    out = eqx.filter_jit(lambda m, v: m(v))(layer, x)
    np.testing.assert_array_equal(out.array, np.full((3, 5), 4.0))
