"""Errors name the axes involved: size clashes (both operands), unknown axes, repeated names."""

import jax.numpy as jnp
import numpy as np
import pytest

import halyard.named as hn
from halyard.named import Axis, NamedArray

BOTH = r"'embed' has size 4 in \(batch=2, embed=4\) but size 5 in \(embed=5, mlp=3\)"


def operands():
    return hn.zeros((Axis("batch", 2), Axis("embed", 4))), hn.zeros((Axis("embed", 5), Axis("mlp", 3)))


@pytest.mark.parametrize(
    "combine",
    [
        lambda a, b: a + b,
        lambda a, b: a * b,
        lambda a, b: a < b,
        lambda a, b: hn.maximum(a, b),
        lambda a, b: hn.where(a > 0, a, b),
        lambda a, b: hn.dot(a, b, axis="embed"),
        lambda a, b: hn.dot(a, b, axis=()),
        lambda a, b: hn.einsum("batch embed, embed mlp -> batch mlp", a, b),
    ],
)
def test_size_clash_names_both_operands(combine):
    a, b = operands()
    with pytest.raises(ValueError, match=BOTH):
        combine(a, b)


def test_size_clash_in_broadcast_to_and_take():
    a, _ = operands()
    with pytest.raises(
        ValueError, match=r"'embed' has size 4 in \(batch=2, embed=4\) but size 6 in the target"
    ):
        hn.broadcast_to(a, (Axis("batch", 2), Axis("embed", 6)))
    index = hn.zeros((Axis("batch", 3), Axis("i", 2)), jnp.int32)
    with pytest.raises(
        ValueError, match=r"'batch' has size 2 in \(batch=2, embed=4\) but size 3 in the index"
    ):
        hn.take(a, "embed", index)


@pytest.mark.parametrize(
    "use",
    [
        lambda x: x.sum("vocab"),
        lambda x: hn.mean(x, ("batch", "vocab")),
        lambda x: hn.argmax(x, "vocab"),
        lambda x: x["vocab", 0],
        lambda x: x.rename({"vocab": "v"}),
        lambda x: x.rearrange("vocab", ...),
        lambda x: hn.softmax(x, "vocab"),
        lambda x: hn.take(x, "vocab", hn.zeros(Axis("i", 1), jnp.int32)),
        lambda x: hn.sort(x, "vocab"),
        lambda x: hn.cumsum(x, "vocab"),
        lambda x: hn.split(x, "vocab", [1]),
        lambda x: hn.pad(x, {"vocab": 1}),
        lambda x: hn.dynamic_slice(x, "vocab", 0, 1),
        lambda x: x.axis("vocab"),
    ],
)
def test_unknown_axis_lists_the_axes(use):
    x = hn.zeros((Axis("batch", 2), Axis("embed", 4)))
    with pytest.raises(KeyError, match=r"'vocab' is not among \(batch=2, embed=4\)"):
        use(x)


def test_wrong_size_for_a_named_axis():
    x = hn.zeros((Axis("batch", 2), Axis("embed", 4)))
    with pytest.raises(
        ValueError, match=r"'embed' has size 4 in \(batch=2, embed=4\), but size 8 was asked for"
    ):
        x.sum(Axis("embed", 8))


def test_repeated_names_are_refused():
    with pytest.raises(ValueError, match=r"'embed' repeats in \(embed=2, embed=2\)"):
        NamedArray(jnp.zeros((2, 2)), (Axis("embed", 2), Axis("embed", 2)))
    with pytest.raises(ValueError, match="'pos' repeats"):
        hn.named(jnp.zeros((2, 3)), ("pos", "pos"))
    with pytest.raises(ValueError, match="names an axis twice"):
        hn.sum(hn.zeros(Axis("pos", 2)), ("pos", "pos"))


def test_construction_errors():
    with pytest.raises(ValueError, match=r"shape \(2, 3\) does not match axes \(batch=3, pos=2\)"):
        NamedArray(jnp.zeros((2, 3)), (Axis("batch", 3), Axis("pos", 2)))
    with pytest.raises(ValueError, match="has 2 dimensions, but axes"):
        hn.named(jnp.zeros((2, 3)), ("batch",))
    with pytest.raises(TypeError, match="non-empty string"):
        Axis("", 3)
    with pytest.raises(TypeError, match="non-negative int"):
        Axis("pos", -1)
    with pytest.raises(TypeError, match="must be Axis objects"):
        NamedArray(jnp.zeros(2), ("pos",))
    with pytest.raises(AttributeError, match="immutable"):
        hn.zeros(Axis("pos", 2)).array = jnp.ones(2)


def test_plain_arrays_with_dimensions_are_refused():
    x = hn.zeros((Axis("batch", 2), Axis("embed", 4)))
    with pytest.raises(TypeError, match=r"plain array of shape \(2, 4\).*Wrap it first"):
        x + jnp.ones((2, 4))
    with pytest.raises(TypeError, match="plain array"):
        x * np.ones(4)
