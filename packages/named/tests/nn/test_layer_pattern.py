"""Layers that differ by a static kind: `repeating_runs` and `Stacked.scan(kinds=...)` against a Python loop."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.named import Axis, NamedArray, named
from halyard.named.nn import BlockSeq, Linear, Stacked
from halyard.named.nn.layer_pattern import Run, repeating_runs

Embed = Axis("embed", 4)


@pytest.mark.parametrize(
    "kinds,runs",
    [
        (["a"] * 5, [Run(0, 5, 1)]),
        (["a", "b"] * 3, [Run(0, 6, 2)]),
        (["l"] * 5 + ["g"] + ["l"] * 5 + ["g"] + ["l", "l"], [Run(0, 12, 6), Run(12, 14, 1)]),
        (["g", "g", "l", "l", "l"], [Run(0, 2, 1), Run(2, 5, 1)]),
        (["a", "b", "c"], [Run(0, 1, 1), Run(1, 2, 1), Run(2, 3, 1)]),
    ],
)
def test_repeating_runs_cover_the_layers_with_the_fewest_runs(kinds, runs):
    assert repeating_runs(kinds) == runs
    for run in runs:  # every run really repeats its pattern
        pattern = kinds[run.start : run.start + run.period]
        assert kinds[run.start : run.stop] == pattern * run.repeats


class Scaled(eqx.Module):
    """A layer whose static kind scales its update: ``x + kind * tanh(linear(x))``."""

    linear: Linear

    @classmethod
    def init(cls, *, key):
        return cls(Linear.init(Embed, Axis("mlp", Embed.size), key=key))

    def __call__(self, x, *, kind):
        return _apply(self, x, kind)


def _apply(layer, x, kind):
    return NamedArray(x.array + kind * jnp.tanh(layer.linear(x).array), x.axes)


KINDS = (0.5, 2.0, 0.5, 2.0, 0.5, -1.0, 3.0)


@pytest.mark.parametrize("remat", ["none", "full", "nested"])
@pytest.mark.parametrize("unroll", [False, True])
def test_scan_with_kinds_equals_a_python_loop(remat, unroll):
    Layers = Axis("layers", len(KINDS))
    stack = Stacked.init(Layers, Scaled, key=jax.random.key(0), remat=remat)
    x = named(jax.random.normal(jax.random.key(1), (3, 4)), ("batch", "embed"))

    def loop(stack, x):
        for index, kind in enumerate(KINDS):
            x = _apply(stack.layer(index), x, kind)
        return jnp.sum(x.array**2)

    def scanned(stack, x):
        return jnp.sum(stack.fold(x, kinds=KINDS, unroll=unroll).array ** 2)

    want, want_grad = eqx.filter_value_and_grad(loop)(stack, x)
    got, got_grad = eqx.filter_jit(eqx.filter_value_and_grad(scanned))(stack, x)
    # two programs: each layer's dot product (4), bias, tanh and residual sum, then the 12 squares' sum
    forward = len(KINDS) * (Embed.size + 2 + FUNCTION_TERMS) + 3 * Embed.size + 1
    np.testing.assert_allclose(got, want, atol=summation_tolerance(want, forward), rtol=0)
    want_weight = want_grad.stacked.linear.weight.array
    bound = summation_tolerance(want_weight, 2 * forward + 3)  # backward; a weight's gradient sums 3 rows
    np.testing.assert_allclose(got_grad.stacked.linear.weight.array, want_weight, atol=bound, rtol=0)
    unrolled = BlockSeq.init(Layers, Scaled, key=jax.random.key(0))
    unrolled_value = jnp.sum(unrolled.fold(x, kinds=KINDS).array ** 2)
    np.testing.assert_allclose(unrolled_value, want, atol=summation_tolerance(want, forward), rtol=0)


def test_kinds_of_the_wrong_length_are_an_error():
    stack = Stacked.init(Axis("layers", 3), Scaled, key=jax.random.key(0))
    x = named(jnp.ones((2, 4)), ("batch", "embed"))
    with pytest.raises(ValueError, match="2 kinds were given for 3 layers"):
        stack.fold(x, kinds=(1.0, 2.0))
