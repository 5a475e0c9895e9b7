"""Stacked (scan) against BlockSeq and a plain Python loop: values and gradients for every remat policy."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, attention_terms, summation_tolerance

from halyard.named import Axis, NamedArray, named
from halyard.named.nn import (
    REMAT_POLICIES,
    BlockSeq,
    Dropout,
    Linear,
    RMSNorm,
    Stacked,
    dot_product_attention,
    effective_remat,
    offload_supported,
)
from halyard.named.nn.remat import nested_block_size

Embed, Mlp, Heads, HeadSize = Axis("embed", 8), Axis("mlp", 12), Axis("heads", 2), Axis("head_size", 4)
Layers = Axis("layers", 4)
# A block's sums and functions: the two norms (8 and a square root each), the qkv projection (8), attention
# over 3 positions, the output projection (2 heads of 4), the MLP's input (8), gelu and output (12).
BLOCK_TERMS = (
    2 * (Embed.size + FUNCTION_TERMS)
    + Embed.size
    + attention_terms(HeadSize.size, 3)
    + Heads.size * HeadSize.size
    + Embed.size
    + FUNCTION_TERMS
    + Mlp.size
)
FORWARD_TERMS = Layers.size * BLOCK_TERMS + FUNCTION_TERMS  # the loss's tanh
# The backward pass through the same sums, and a weight's gradient summed over the 2 x 3 positions.
GRADIENT_TERMS = 2 * FORWARD_TERMS + 2 * 3


class Block(eqx.Module):
    """A tiny pre-norm transformer block: attention (a batched dot) and an MLP."""

    norm: RMSNorm
    qkv: Linear
    out: Linear
    up: Linear
    down: Linear
    gate: jax.Array  # a plain (unnamed) parameter, to exercise non-NamedArray leaves
    dropout: Dropout

    @classmethod
    def init(cls, Embed, Mlp, *, key, dropout=0.0):
        k = jax.random.split(key, 5)
        qkv = Linear.init(Embed, (Axis("qkv", 3), Heads, HeadSize), key=k[0])
        return cls(
            RMSNorm.init(Embed),
            qkv,
            Linear.init((Heads, HeadSize), Embed, key=k[1]),
            Linear.init(Embed, Mlp, key=k[2]),
            Linear.init(Mlp, Embed, key=k[3]),
            jax.random.uniform(k[4], (), minval=0.5, maxval=1.5),
            Dropout(dropout),
        )

    def __call__(self, x, scale, *, key=None):
        h = self.qkv(self.norm(x))
        q, k, v = (h["qkv", i] for i in range(3))
        attended = dot_product_attention(q, k, v)
        x = x + self.out(attended) * scale
        mlp = self.down(NamedArray(jax.nn.gelu(self.up(self.norm(x)).array), self.up(x).axes))
        return x + self.dropout(mlp, key=key, inference=key is None) * self.gate


def _input():
    return named(jax.random.normal(jax.random.PRNGKey(1), (2, 3, 8)), ("batch", "pos", "embed"))


def _loss(stack, x):
    return jnp.sum(jnp.tanh(stack.fold(x, 0.5).array))


def _loop_loss(layers, x):
    for layer in layers:
        x = layer(x, 0.5)
    return jnp.sum(jnp.tanh(x.array))


def _assert_trees_close(a, b, terms=None):
    """Equal leaves: to the order of ``terms`` at each leaf's size, or bit for bit (None: the same values
    by construction, as the same initialisation stacked or sliced)."""
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for left, right in zip(leaves_a, leaves_b):
        if terms is None:
            np.testing.assert_array_equal(np.asarray(left), np.asarray(right))
        else:
            bound = summation_tolerance(right, terms)
            np.testing.assert_allclose(np.asarray(left), np.asarray(right), atol=bound, rtol=0)


@pytest.fixture(scope="module")
def base():
    """Layers initialised once, and the reference: a jitted plain Python loop (no scan, no remat)."""
    stacked = Stacked.init(Layers, Block, Embed, Mlp, key=jax.random.PRNGKey(0))
    x = _input()
    reference = jax.jit(jax.value_and_grad(_loop_loss, argnums=(0, 1)))(stacked.layers(), x)
    return stacked, x, reference


@pytest.mark.parametrize("remat", REMAT_POLICIES)
def test_stacked_equals_unrolled_in_values_and_gradients(base, remat):
    plain, x, (ref_value, (ref_grad_layers, ref_grad_x)) = base
    stacked = Stacked(plain.stacked, Layers, remat)
    unrolled = BlockSeq(tuple(plain.layers()), Layers, remat)
    value, (grad_params, grad_x) = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1)))(stacked, x)
    seq_value, (seq_grad_params, seq_grad_x) = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1)))(unrolled, x)
    bound = summation_tolerance(2 * 3 * 8, FORWARD_TERMS + 2 * 3 * 8)  # a sum of 48 tanh's of both signs
    np.testing.assert_allclose(float(value), float(ref_value), atol=bound, rtol=0)
    np.testing.assert_allclose(float(seq_value), float(ref_value), atol=bound, rtol=0)
    _assert_trees_close(grad_x, ref_grad_x, GRADIENT_TERMS)
    _assert_trees_close(seq_grad_x, ref_grad_x, GRADIENT_TERMS)
    _assert_trees_close(grad_params, Stacked.from_layers(ref_grad_layers, Layers), GRADIENT_TERMS)
    _assert_trees_close(
        Stacked.from_layers(seq_grad_params.layers(), Layers, remat), grad_params, GRADIENT_TERMS
    )


@pytest.mark.parametrize("remat", ["full", "save_dots", "nested", "offload"])
def test_remat_policy_puts_checkpoints_in_the_gradient_program(base, remat):
    plain, x, _ = base
    program = str(jax.make_jaxpr(jax.grad(_loss))(Stacked(plain.stacked, Layers, remat), x))
    assert "checkpoint" in program or "remat" in program
    plain_program = str(jax.make_jaxpr(jax.grad(_loss))(plain, x))
    assert "checkpoint" not in plain_program and "remat" not in plain_program


def test_init_gives_layers_axis_first_and_distinct_layers(base):
    stacked = base[0]
    assert stacked.stacked.up.weight.axis_names == ("layers", "embed", "mlp")
    assert stacked.stacked.gate.shape == (4,)
    first, second = stacked.layer(0), stacked.layer(1)
    assert first.up.weight.axis_names == ("embed", "mlp")
    assert not np.allclose(np.asarray(first.up.weight.array), np.asarray(second.up.weight.array))
    _assert_trees_close(
        stacked,
        Stacked.from_layers(
            BlockSeq.init(Layers, Block, Embed, Mlp, key=jax.random.PRNGKey(0)).layers(), Layers
        ),
        1,  # the vmapped initialisation scales the same draws in another program: one rounding apart
    )
    _assert_trees_close(Stacked.from_layers(stacked.layers(), Layers), stacked)
    assert stacked.unrolled().num_layers == 4


def test_scan_stacks_per_layer_outputs_along_layers(base):
    stacked = base[0]

    def with_output(block):
        def run(x, scale):
            y = block(x, scale)
            return y, (y.sum("embed"), jnp.mean(y.array))

        return run

    class Wrapped(eqx.Module):
        block: Block

        def __call__(self, x, scale):
            return with_output(self.block)(x, scale)

    wrapped = Stacked(Wrapped(stacked.stacked), Layers)
    x = _input()
    final, (sums, means) = wrapped.scan(x, 0.5)
    assert sums.axis_names == ("layers", "batch", "pos")
    assert means.shape == (4,)
    h = x
    for i, layer in enumerate(stacked.layers()):
        h = layer(h, 0.5)
        addends = np.abs(np.asarray(h.array)).sum(-1)  # the sum over embed cancels
        bound = summation_tolerance(addends, (i + 1) * BLOCK_TERMS + Embed.size)
        np.testing.assert_allclose(
            np.asarray(sums.array[i]), np.asarray(h.sum("embed").array), atol=bound, rtol=0
        )
    bound = summation_tolerance(h.array, Layers.size * BLOCK_TERMS)
    np.testing.assert_allclose(np.asarray(final.array), np.asarray(h.array), atol=bound, rtol=0)
    _, (seq_sums, _) = wrapped.unrolled().scan(x, 0.5)
    bound = summation_tolerance(addends, Layers.size * BLOCK_TERMS + Embed.size)
    np.testing.assert_allclose(np.asarray(seq_sums.array), np.asarray(sums.array), atol=bound, rtol=0)


def test_per_layer_dropout_keys_match_between_stacked_and_unrolled():
    stacked = Stacked.init(Layers, Block, Embed, Mlp, key=jax.random.PRNGKey(0), dropout=0.5)
    x = _input()
    key = jax.random.PRNGKey(7)
    with_dropout = stacked.fold(x, 0.5, key=key)
    unrolled = np.asarray(stacked.unrolled().fold(x, 0.5, key=key).array)
    bound = summation_tolerance(unrolled, Layers.size * BLOCK_TERMS + 1)  # + the dropout's scaling
    np.testing.assert_allclose(np.asarray(with_dropout.array), unrolled, atol=bound, rtol=0)
    assert not np.allclose(np.asarray(with_dropout.array), np.asarray(stacked.fold(x, 0.5).array))


class _Permuting(eqx.Module):
    scale: NamedArray

    @classmethod
    def init(cls, *, key):
        return cls(named(jax.random.normal(key, (8,)), ("embed",)))

    def __call__(self, x):
        return (x * self.scale).rearrange("embed", ...)


class _Shrinking(_Permuting):
    def __call__(self, x):
        return x.sum("embed")


def test_carry_axis_order_is_restored_and_axis_changes_are_errors():
    x = _input()
    stacked = Stacked.init(Axis("layers", 3), _Permuting, key=jax.random.PRNGKey(0))
    out = stacked.fold(x)
    assert out.axis_names == x.axis_names
    expected = np.asarray(x.array) * np.prod(np.asarray(stacked.stacked.scale.array), axis=0)
    np.testing.assert_allclose(
        np.asarray(out.array), expected, rtol=summation_tolerance(1, 3 + 1)
    )  # 3 products
    shrinking = Stacked.init(Axis("layers", 3), _Shrinking, key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="must return its input's axes"):
        shrinking.fold(x)


def test_stack_errors():
    with pytest.raises(ValueError, match="remat"):
        Stacked.init(Layers, _Permuting, key=jax.random.PRNGKey(0), remat="sometimes")
    with pytest.raises(TypeError, match="Axis"):
        Stacked.init("layers", _Permuting, key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="already has an axis"):
        Stacked.init(Axis("embed", 2), _Permuting, key=jax.random.PRNGKey(0))
    small = _Permuting.init(key=jax.random.PRNGKey(0))
    other = _Permuting(named(jnp.ones(5), ("embed",)))
    with pytest.raises(ValueError, match="structure"):
        Stacked.from_layers([small, other])


def test_nested_block_size_and_offload_fallback():
    assert nested_block_size(24) == 4
    assert nested_block_size(16) == 4
    assert nested_block_size(7) == 1
    assert nested_block_size(1) == 1
    expected = "offload" if offload_supported() else "save_dots"
    assert effective_remat("offload") == expected
    assert effective_remat("nested") == "nested"


class _Cached(eqx.Module):
    """Adds a per-layer input (like a KV cache slice) and returns it updated as a per-layer output."""

    scale: NamedArray

    @classmethod
    def init(cls, *, key):
        return cls(named(jax.random.normal(key, (8,)), ("embed",)))

    def __call__(self, x, cache, shift):
        y = x * self.scale + cache + shift
        return y, cache + 1.0


@pytest.mark.parametrize("remat", ["none", "nested"])
def test_named_arguments_with_the_layers_axis_are_sliced_per_layer(remat):
    layers = Axis("layers", 4)
    stacked = Stacked.init(layers, _Cached, key=jax.random.PRNGKey(3), remat=remat)
    x = _input()
    cache = named(jax.random.normal(jax.random.PRNGKey(4), (8, 4)), ("embed", "layers"))  # layers not first
    final, new_cache = jax.jit(lambda s, x, c: s.scan(x, c, shift=2.0))(stacked, x, cache)
    h = x
    for i, layer in enumerate(stacked.layers()):
        h, _ = layer(h, cache["layers", i], 2.0)
    # 4 layers of a product and two sums, at the size of what they add up to (they cancel)
    addends = np.abs(np.asarray(x.array))
    for i in range(4):
        addends = (
            addends * np.abs(np.asarray(stacked.stacked.scale.array[i]))
            + np.abs(np.asarray(cache.array[:, i]))
            + 2.0
        )
    bound = summation_tolerance(addends, 4 * 3)
    np.testing.assert_allclose(np.asarray(final.array), np.asarray(h.array), atol=bound, rtol=0)
    assert new_cache.axis_names == ("layers", "embed")
    np.testing.assert_array_equal(np.asarray(new_cache.array), np.asarray(cache.array).T + 1.0)  # one sum
    seq_final, seq_cache = stacked.unrolled().scan(x, cache, shift=2.0)
    np.testing.assert_allclose(np.asarray(seq_final.array), np.asarray(h.array), atol=bound, rtol=0)
    np.testing.assert_array_equal(np.asarray(seq_cache.array), np.asarray(new_cache.array))
    with pytest.raises(ValueError, match="stack has 4 layers"):
        stacked.scan(x, named(jnp.zeros((8, 3)), ("embed", "layers")), shift=2.0)
