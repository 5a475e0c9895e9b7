"""to_state_dict / from_state_dict: keys, unstacked layers, round trips, and errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from halyard.named import Axis, NamedArray, named
from halyard.named.nn import BlockSeq, Embedding, LayerNorm, Linear, Stacked
from halyard.named.serialization import from_state_dict, map_state_dict_keys, to_state_dict

Embed, Mlp, Vocab, Layers = Axis("embed", 4), Axis("mlp", 6), Axis("vocab", 10), Axis("layers", 3)


class Block(eqx.Module):
    norm: LayerNorm
    up: Linear
    scales: list  # a list of plain arrays, keyed by index

    @classmethod
    def init(cls, *, key):
        return cls(LayerNorm.init(Embed), Linear.init(Embed, Mlp, key=key), [jnp.ones(2), jnp.zeros(())])


class Model(eqx.Module):
    embed: Embedding
    layers: eqx.Module
    head: Linear | None
    name: str = eqx.field(static=True, default="tiny")


def _model(stack=Stacked, seed=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return Model(Embedding.init(Vocab, Embed, key=k1), stack.init(Layers, Block, key=k2), None)


def _assert_same(a, b):
    for left, right in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right))


def test_keys_unstack_layers_and_values_match():
    model = _model()
    state = to_state_dict(model)
    expected_keys = ["embed.weight"] + [
        f"layers.{i}.{p}"
        for i in range(3)
        for p in ("norm.weight", "norm.bias", "up.weight", "up.bias", "scales.0", "scales.1")
    ]
    assert list(state) == expected_keys
    assert state["layers.1.up.weight"].shape == (4, 6)
    np.testing.assert_array_equal(
        np.asarray(state["layers.2.up.weight"]), np.asarray(model.layers.stacked.up.weight.array[2])
    )
    assert "model.embed.weight" in to_state_dict(model, prefix="model")


def test_stacked_and_block_seq_have_identical_state_dicts():
    stacked_state = to_state_dict(_model(Stacked))
    seq_state = to_state_dict(_model(BlockSeq))
    assert list(stacked_state) == list(seq_state)
    for key in stacked_state:
        np.testing.assert_array_equal(np.asarray(stacked_state[key]), np.asarray(seq_state[key]))


def test_round_trip_through_numpy_and_across_stack_kinds():
    source = _model(Stacked, seed=1)
    state = {k: np.asarray(v) for k, v in to_state_dict(source).items()}
    loaded = from_state_dict(_model(Stacked, seed=2), state)
    _assert_same(loaded, source)
    assert loaded.layers.stacked.up.weight.axis_names == ("layers", "embed", "mlp")
    as_seq = from_state_dict(_model(BlockSeq, seed=2), state)
    _assert_same(Stacked.from_layers(as_seq.layers.layers(), as_seq.layers.Layers), source.layers)


def test_values_are_cast_to_the_template_dtype():
    state = {k: np.asarray(v, dtype=np.float16) for k, v in to_state_dict(_model(seed=3)).items()}
    loaded = from_state_dict(_model(seed=4), state)
    assert loaded.embed.weight.dtype == jnp.float32
    np.testing.assert_allclose(
        np.asarray(loaded.embed.weight.array), state["embed.weight"].astype(np.float32), rtol=0, atol=0
    )


def test_works_with_an_abstract_template():
    source = _model(seed=5)
    template = eqx.filter_eval_shape(_model, Stacked, 6)
    loaded = from_state_dict(template, to_state_dict(source))
    _assert_same(loaded, source)
    listing = to_state_dict(template)
    assert list(listing) == list(to_state_dict(source))
    assert listing["layers.2.up.weight"].shape == (4, 6)


def test_missing_unexpected_and_mismatched_keys_are_named():
    template = _model()
    state = dict(to_state_dict(template))
    del state["layers.1.up.bias"]
    with pytest.raises(KeyError, match=r"layers\.1\.up\.bias"):
        from_state_dict(template, state)
    partial = from_state_dict(template, state, strict=False)
    _assert_same(partial, template)

    extra = dict(to_state_dict(template), **{"layers.0.up.extra": np.zeros(3)})
    with pytest.raises(ValueError, match=r"unexpected.*layers\.0\.up\.extra"):
        from_state_dict(template, extra)

    wrong = dict(to_state_dict(template), **{"layers.2.up.weight": np.zeros((6, 4))})
    with pytest.raises(ValueError, match=r"'layers\.2\.up\.weight' has shape \(6, 4\).*\(4, 6\).*embed"):
        from_state_dict(template, wrong)


def test_map_state_dict_keys():
    state = to_state_dict(_model())
    renamed = map_state_dict_keys(state, lambda k: "transformer." + k.replace("layers.", "h."))
    assert "transformer.h.0.up.weight" in renamed
    with pytest.raises(ValueError, match="two keys"):
        map_state_dict_keys(state, lambda k: "same")


def test_plain_pytrees_and_named_arrays():
    tree = {"a": named(jnp.arange(3.0), ("x",)), "b": (jnp.ones(2), None, 3.0)}
    state = to_state_dict(tree)
    assert list(state) == ["a", "b.0"]
    loaded = from_state_dict(tree, {"a": np.array([5.0, 6.0, 7.0]), "b.0": np.zeros(2)})
    assert isinstance(loaded["a"], NamedArray) and loaded["a"].axis_names == ("x",)
    assert loaded["b"][2] == 3.0


def test_a_stack_at_the_root_with_a_prefix():
    stack = Stacked.init(Layers, Block, key=jax.random.PRNGKey(9))
    state = to_state_dict(stack, prefix="h")
    assert "h.2.up.weight" in state and "h.0.scales.1" in state
    _assert_same(from_state_dict(stack, state, prefix="h"), stack)
    assert "0.up.weight" in to_state_dict(stack)
