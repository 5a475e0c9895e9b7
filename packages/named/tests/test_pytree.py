"""NamedArray as a pytree under jit, grad, jax.vmap (with hn.vmap), lax.scan, checkpoint and eqx."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

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
    np.testing.assert_allclose(grads["w"].array, raw_grads["w"], rtol=1e-5)
    np.testing.assert_allclose(grads["b"].array, raw_grads["b"], rtol=1e-5)
    out = jax.jit(model)(p, x)
    assert out.axes == (Batch, Mlp)


def test_value_and_grad_with_respect_to_a_named_input():
    x = hn.random.normal(jax.random.key(1), (Batch, Embed))
    value, grad = jax.value_and_grad(lambda v: hn.logsumexp(v, ("batch", "embed")).array)(x)
    np.testing.assert_allclose(value, jax.nn.logsumexp(x.array), rtol=1e-6)
    np.testing.assert_allclose(grad.array, jax.nn.softmax(x.array.reshape(-1)).reshape(3, 4), rtol=1e-5)


def test_hn_vmap_equals_jax_vmap_on_raw_arrays():
    p = params()
    x = hn.random.normal(jax.random.key(1), (Embed, Batch))  # batch last: vmap finds it by name
    out = hn.vmap(model, "batch")(p, x)
    expected = jax.vmap(model_raw, in_axes=(None, 1))({k: v.array for k, v in p.items()}, x.array)
    assert out.axes == (Batch, Mlp)
    np.testing.assert_allclose(out.array, expected, rtol=1e-5)


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
    np.testing.assert_allclose(total.array, expected, rtol=1e-5)


def test_equinox_modules_hold_named_arrays():
    class Layer(eqx.Module):
        weight: NamedArray

        def __call__(self, x: NamedArray) -> NamedArray:
            return hn.dot(x, self.weight, axis="embed")

    layer = Layer(hn.ones((Embed, Mlp)))
    x = hn.ones((Batch, Embed))
    grads = eqx.filter_grad(lambda m: m(x).sum().array)(layer)
    assert grads.weight.axes == (Embed, Mlp)
    np.testing.assert_allclose(grads.weight.array, np.full((4, 5), 3.0))
    out = eqx.filter_jit(lambda m, v: m(v))(layer, x)
    np.testing.assert_allclose(out.array, np.full((3, 5), 4.0))
