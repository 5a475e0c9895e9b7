"""Linear and Embedding against plain numpy / jax references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.named import Axis, NamedArray, named
from halyard.named.nn import Embedding, Linear

Batch, Pos, Embed = Axis("batch", 2), Axis("pos", 3), Axis("embed", 8)
Heads, HeadSize = Axis("heads", 2), Axis("head_size", 4)
Vocab = Axis("vocab", 11)


def test_linear_single_axis_matches_numpy():
    layer = Linear.init(Embed, Axis("mlp", 5), key=jax.random.PRNGKey(0))
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32)
    y = layer(named(x, ("batch", "pos", "embed")))
    expected = x @ np.asarray(layer.weight.array) + np.asarray(layer.bias.array)
    assert y.axis_names == ("batch", "pos", "mlp")
    # numpy's float32 in its order: 8 products and the bias, at the size of the addends (they cancel)
    addends = np.abs(x) @ np.abs(np.asarray(layer.weight.array)) + np.abs(np.asarray(layer.bias.array))
    np.testing.assert_allclose(
        np.asarray(y.array), expected, atol=summation_tolerance(addends, 8 + 1), rtol=0
    )


def test_linear_multi_axis_in_and_out_any_input_order():
    to_heads = Linear.init(Embed, (Heads, HeadSize), key=jax.random.PRNGKey(1))
    back = Linear.init((Heads, HeadSize), Embed, key=jax.random.PRNGKey(2), use_bias=False)
    x = np.random.default_rng(1).normal(size=(3, 2, 8)).astype(np.float32)  # pos, batch, embed
    h = to_heads(named(x, ("pos", "batch", "embed")))
    assert h.axis_names == ("pos", "batch", "heads", "head_size")
    w = np.asarray(to_heads.weight.array)
    expected = np.einsum("pbe,ehd->pbhd", x, w) + np.asarray(to_heads.bias.array)
    addends = np.einsum("pbe,ehd->pbhd", np.abs(x), np.abs(w)) + np.abs(np.asarray(to_heads.bias.array))
    np.testing.assert_allclose(
        np.asarray(h.array), expected, atol=summation_tolerance(addends, 8 + 1), rtol=0
    )
    out = back(h.rearrange("heads", "batch", "head_size", "pos"))
    expected_out = np.einsum("pbhd,hde->bpe", expected, np.asarray(back.weight.array))
    # the second product's 8 terms after the first's 9
    addends_out = np.einsum("pbhd,hde->bpe", addends, np.abs(np.asarray(back.weight.array)))
    bound = summation_tolerance(addends_out, 9 + 8)
    np.testing.assert_allclose(
        np.asarray(out.unwrap("batch", "pos", "embed")), expected_out, atol=bound, rtol=0
    )
    assert back.bias is None


def test_linear_init_std_and_scale():
    In, Out = Axis("embed", 256), Axis("mlp", 256)
    default = Linear.init(In, Out, key=jax.random.PRNGKey(3))
    assert abs(float(jnp.std(default.weight.array)) - 1 / 16) < 0.005
    custom = Linear.init(In, Out, key=jax.random.PRNGKey(3), init_std=0.02, init_scale=0.5)
    assert abs(float(jnp.std(custom.weight.array)) - 0.01) < 0.001


def test_linear_dot_general_hook_is_used():
    calls = []

    def recording_dot_general(lhs, rhs, dimension_numbers, **kwargs):
        calls.append(dimension_numbers)
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, **kwargs) * 2.0

    plain = Linear.init(Embed, Axis("mlp", 5), key=jax.random.PRNGKey(4), use_bias=False)
    hooked = Linear.init(
        Embed, Axis("mlp", 5), key=jax.random.PRNGKey(4), use_bias=False, dot_general=recording_dot_general
    )
    x = named(jnp.ones((2, 8)), ("batch", "embed"))
    # the same dot_general on the same weights, doubled: exact
    np.testing.assert_array_equal(np.asarray(hooked(x).array), 2 * np.asarray(plain(x).array))
    assert calls


def test_linear_grad_and_jit_match_reference():
    layer = Linear.init(Embed, Axis("mlp", 5), key=jax.random.PRNGKey(5))
    x = named(jax.random.normal(jax.random.PRNGKey(6), (2, 8)), ("batch", "embed"))

    def loss(lin):
        return jnp.sum(jnp.tanh(lin(x).array))

    grads = jax.jit(jax.grad(loss))(layer)

    def reference(w, b):
        return jnp.sum(jnp.tanh(x.array @ w + b))

    gw, gb = jax.grad(reference, argnums=(0, 1))(layer.weight.array, layer.bias.array)
    # two programs: the 8 products, the bias and the tanh forward and backward, the 2 rows summed
    terms = 2 * (8 + 1 + FUNCTION_TERMS) + 2
    np.testing.assert_allclose(
        np.asarray(grads.weight.array), gw, atol=summation_tolerance(gw, terms), rtol=0
    )
    np.testing.assert_allclose(np.asarray(grads.bias.array), gb, atol=summation_tolerance(gb, terms), rtol=0)


def test_linear_errors_name_the_axes():
    with pytest.raises(ValueError, match="share the names"):
        Linear.init(Embed, Embed, key=jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match="Axis"):
        Linear.init("embed", Embed.alias("out"), key=jax.random.PRNGKey(0))
    layer = Linear.init(Embed, Axis("mlp", 5), key=jax.random.PRNGKey(0))
    with pytest.raises(KeyError, match="embed"):
        layer(named(jnp.ones((2, 8)), ("batch", "hidden")))
    with pytest.raises(ValueError, match="size"):
        layer(named(jnp.ones((2, 7)), ("batch", "embed")))
    with pytest.raises(ValueError, match="mlp"):
        layer(named(jnp.ones((5, 8)), ("mlp", "embed")))


def test_embedding_lookup_and_unembed_match_numpy():
    emb = Embedding.init(Vocab, Embed, key=jax.random.PRNGKey(7))
    ids = np.array([[1, 0, 10], [3, 3, 5]], dtype=np.int32)
    vectors = emb(named(ids, ("batch", "pos")))
    table = np.asarray(emb.weight.array)
    assert vectors.axis_names == ("batch", "pos", "embed")
    np.testing.assert_array_equal(np.asarray(vectors.array), table[ids])  # a gather: exact
    logits = emb.unembed(vectors.rearrange("embed", "pos", "batch"))
    assert logits.axis_names == ("pos", "batch", "vocab")
    bound = summation_tolerance(
        np.abs(table[ids]) @ np.abs(table.T), Embed.size
    )  # numpy's 8 terms, its order
    np.testing.assert_allclose(
        np.asarray(logits.unwrap("batch", "pos", "vocab")), table[ids] @ table.T, atol=bound, rtol=0
    )
    assert (
        abs(
            float(jnp.std(Embedding.init(Axis("vocab", 1000), Embed, key=jax.random.PRNGKey(0)).weight.array))
            - 0.02
        )
        < 0.002
    )


def test_embedding_gradient_scatters_into_rows():
    emb = Embedding.init(Vocab, Embed, key=jax.random.PRNGKey(8))
    ids = named(jnp.array([2, 2, 4]), ("pos",))
    grads = jax.grad(lambda e: jnp.sum(e(ids).array))(emb)
    expected = np.zeros((11, 8), np.float32)
    expected[2] = 2.0
    expected[4] = 1.0
    np.testing.assert_array_equal(np.asarray(grads.weight.array), expected)  # sums of ones: exact


def test_embedding_errors():
    emb = Embedding.init(Vocab, Embed, key=jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match="integer"):
        emb(named(jnp.ones((3,)), ("pos",)))
    with pytest.raises(TypeError, match="Axis"):
        Embedding.init("vocab", Embed, key=jax.random.PRNGKey(0))
    with pytest.raises(KeyError, match="embed"):
        emb.unembed(NamedArray(jnp.ones((3, 8)), (Pos, Axis("hidden", 8))))
