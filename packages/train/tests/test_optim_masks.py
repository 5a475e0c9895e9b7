"""Weight-decay masks, per-parameter learning-rate multipliers and Muon's matrix layout, by path and axis."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from float_tolerance import summation_tolerance

from halyard.named import Axis, NamedArray
from halyard.named.nn import Embedding, Linear
from halyard.train.optim.multipliers import scale_by_multipliers
from halyard.train.optim.muon import matrix_dimension_numbers, muon_labels
from halyard.train.optim.optimizers import adamw, muon
from halyard.train.optim.paths import default_weight_decay_mask, map_parameters

Embed, Mlp, Vocab, Layers = Axis("embed", 4), Axis("mlp", 6), Axis("vocab", 10), Axis("layers", 2)
Heads, HeadSize = Axis("heads", 2), Axis("head_size", 3)


def model_tree() -> dict:
    key = jax.random.key(0)
    return {
        "token_embedding": Embedding.init(Vocab, Embed, key=key),
        "wpe": jnp.ones((8, 4)),
        "up_proj": Linear.init(Embed, Mlp, key=key),
        "o_proj": Linear.init((Heads, HeadSize), Embed, key=key, use_bias=False),
        "ln_f": {"weight": NamedArray(jnp.ones(4), (Embed,))},
        "stacked_norm": NamedArray(jnp.ones((2, 4)), (Layers, Embed)),
        "stacked_matrix": NamedArray(jnp.ones((2, 4, 6)), (Layers, Embed, Mlp)),
        "norm": {"scale": jnp.ones((4, 4))},
        "plain_matrix": jnp.ones((3, 5)),
        "plain_vector": jnp.ones(5),
    }


def by_name(tree) -> dict[str, object]:
    found: dict[str, object] = {}
    map_parameters(
        lambda name, value: found.setdefault(name, value.array if isinstance(value, NamedArray) else value),
        tree,
    )
    return found


def test_default_decay_mask_decays_only_matrices():
    decays = by_name(default_weight_decay_mask(model_tree()))
    assert decays == {
        "token_embedding.weight": False,
        "wpe": False,
        "up_proj.weight": True,
        "up_proj.bias": False,
        "o_proj.weight": True,
        "ln_f.weight": False,
        "stacked_norm": False,
        "stacked_matrix": True,
        "norm.scale": False,
        "plain_matrix": True,
        "plain_vector": False,
    }


def test_mask_has_the_leaf_structure_of_the_params():
    tree = model_tree()
    assert jax.tree.structure(default_weight_decay_mask(tree)) == jax.tree.structure(tree)


def test_weight_decay_applies_exactly_where_the_mask_says():
    params = model_tree()
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    optimizer = adamw(1.0, weight_decay=0.5, max_grad_norm=None)
    updates, _ = optimizer.update(zero_grads, optimizer.init(params), params)
    decays = jax.tree.leaves(default_weight_decay_mask(params))
    for update, param, decayed in zip(jax.tree.leaves(updates), jax.tree.leaves(params), decays, strict=True):
        expected = -0.5 * np.asarray(param) if decayed else np.zeros(param.shape)
        # zero moments give a zero Adam step; the decay's product by 0.5 and by -1.0 are exact
        np.testing.assert_array_equal(np.asarray(update), expected)


def test_multipliers_from_a_tree_and_from_a_function_scale_updates():
    params = {"hidden": NamedArray(jnp.ones((4, 6)), (Embed, Mlp)), "out": jnp.ones((6, 2))}
    grads = {"hidden": NamedArray(jnp.full((4, 6), 0.5), (Embed, Mlp)), "out": jnp.full((6, 2), 2.0)}
    as_tree = jax.tree.map(lambda _: 1.0, params)
    as_tree["hidden"] = NamedArray.tree_unflatten((Embed, Mlp), (0.25,))
    for multipliers in (as_tree, lambda name, param: 0.25 if name == "hidden" else 1.0):
        transform = scale_by_multipliers(multipliers)
        updates, _ = transform.update(grads, transform.init(params), params)
        np.testing.assert_array_equal(updates["hidden"].array, 0.125)  # 0.5 * 0.25: powers of two, exact
        np.testing.assert_array_equal(updates["out"], 2.0)
        assert updates["hidden"].axes == (Embed, Mlp)


def test_multipliers_inside_an_optimizer():
    params = {"a": jnp.ones(3), "b": jnp.ones(3)}
    grads = {"a": jnp.ones(3), "b": jnp.ones(3)}
    optimizer = adamw(
        0.1, lr_multipliers=lambda name, _: 3.0 if name == "a" else 1.0, weight_decay=0.0, max_grad_norm=None
    )
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    expected = 3 * np.asarray(updates["b"])
    # one product by 3, and one more rounding where the learning rate and the multiplier are folded first
    np.testing.assert_allclose(updates["a"], expected, atol=summation_tolerance(expected, 2), rtol=0)


def test_muon_groups_and_matrix_layout_follow_linear_in_and_out():
    tree = model_tree()
    labels = by_name(muon_labels(tree))
    assert labels["token_embedding.weight"] == labels["wpe"] == labels["up_proj.bias"] == "adam"
    assert labels["stacked_norm"] == labels["ln_f.weight"] == "adam"
    assert labels["up_proj.weight"] == labels["o_proj.weight"] == labels["stacked_matrix"] == "muon"

    stacked_o_proj = eqx.tree_at(
        lambda linear: linear.weight,
        tree["o_proj"],
        NamedArray(jnp.ones((2, 2, 3, 4)), (Layers, Heads, HeadSize, Embed)),
    )
    numbers = matrix_dimension_numbers({"o_proj": tree["o_proj"], "stacked": stacked_o_proj, **tree})
    assert numbers["o_proj"].weight.array == optax.contrib.MuonDimensionNumbers((0, 1), (2,))
    assert numbers["stacked"].weight.array == optax.contrib.MuonDimensionNumbers((1, 2), (3,))
    assert numbers["up_proj"].weight.array == optax.contrib.MuonDimensionNumbers((0,), (1,))
    assert numbers["stacked_matrix"].array == optax.contrib.MuonDimensionNumbers((1,), (2,))
    assert numbers["plain_matrix"] == optax.contrib.MuonDimensionNumbers(0, 1)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_bad_clip_norm_is_refused(bad):
    with pytest.raises(ValueError, match="max_grad_norm"):
        adamw(0.1, max_grad_norm=bad, weight_decay=0.0)


def test_muon_updates_a_whole_model_tree_under_jit():
    params = model_tree()
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    grads = jax.tree.unflatten(treedef, [jax.random.normal(k, leaf.shape) for k, leaf in zip(keys, leaves)])
    row_scales = jnp.array([1.0, 3.0, 0.3, 0.1])[:, None]  # a badly conditioned gradient for up_proj
    grads["up_proj"] = eqx.tree_at(
        lambda linear: linear.weight.array, grads["up_proj"], grads["up_proj"].weight.array * row_scales
    )
    optimizer = muon(0.1, weight_decay=0.0, max_grad_norm=None)
    updates, _ = jax.jit(optimizer.update)(grads, optimizer.init(params), params)
    assert jax.tree.structure(updates) == jax.tree.structure(params)
    # the Linear weight was orthogonalised: near-equal singular values, unlike its gradient's ...
    gradient_values = np.linalg.svd(np.asarray(grads["up_proj"].weight.array), compute_uv=False)
    assert gradient_values.max() / gradient_values.min() > 10.0
    update_values = np.linalg.svd(np.asarray(updates["up_proj"].weight.array), compute_uv=False)
    assert update_values.max() / update_values.min() < 2.0
    # ... while the embedding table took Adam's first step: -lr * sign(gradient)
    embedding_gradient = np.asarray(grads["token_embedding"].weight.array)
    np.testing.assert_allclose(
        np.asarray(updates["token_embedding"].weight.array), -0.1 * np.sign(embedding_gradient), rtol=1e-3
    )
