"""LoRA adapters (halyard.models.lora): the function they add (against numpy), PEFT's initialisation, the
targets a family has, merging, dropout from a key, scan / unrolled / remat, and FSDP and tensor-parallel
placements giving the single-device loss and gradients (8 simulated CPU devices)."""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import (
    assert_loss_and_grads_close,
    decoder_terms,
    summation_tolerance,
    training_terms,
)
from tiny import VOCAB, random_tokens, tiny

from halyard.models import CausalLM, LmBatch
from halyard.models.lora import (
    RANK,
    TARGET_MODULES,
    LoraAdapter,
    LoraConfig,
    LoraLinear,
    add_lora,
    init_lora,
    lora_params,
    merge_lora,
    with_dropout_keys,
    with_lora,
    without_lora,
)
from halyard.named import Axis, NamedArray
from halyard.named.nn import Linear
from halyard.shard import Layout, MeshSpec, init_sharded, use_layout

ALL = tuple(TARGET_MODULES)
BATCH = LmBatch.from_tokens(np.random.default_rng(0).integers(0, VOCAB, size=(8, 9)))


def _random_b(adapters: dict[str, LoraAdapter], seed: int = 3) -> dict[str, LoraAdapter]:
    """The adapters with a random B (a fresh B is zero, which hides every mistake but A's)."""
    keys = iter(jax.random.split(jax.random.key(seed), len(adapters)))
    return {
        name: LoraAdapter(a.lora_a, NamedArray(0.2 * jax.random.normal(next(keys), a.lora_b.array.shape), a.lora_b.axes), a.alpha, a.dropout)
        for name, a in adapters.items()
    }  # fmt: skip


@functools.cache
def _base() -> CausalLM:
    """The tests' llama, built at the first call (not when a test worker collects the file)."""
    return tiny("llama").init(jax.random.key(0))


@functools.cache
def _adapters() -> dict[str, LoraAdapter]:
    """Rank-4 adapters on every target of `_base` (B random), built at the first call."""
    return _random_b(
        init_lora(_base(), LoraConfig(rank=4, alpha=12.0, target_modules=ALL), key=jax.random.key(1))
    )


# The adapters' own sums (over the rank, in every adapted projection of every layer) beside the model's.
ADAPTER_TERMS = 4 * len(ALL) * tiny("llama").shape.layers
TRAIN_TERMS = training_terms(tiny("llama"), 8, 9) + 2 * ADAPTER_TERMS


def test_a_lora_linear_adds_x_a_b_times_alpha_over_rank() -> None:
    Embed, Heads, HeadSize = Axis("embed", 6), Axis("heads", 2), Axis("head_size", 3)
    linear = Linear.init(Embed, (Heads, HeadSize), key=jax.random.key(0))
    adapter = LoraAdapter.init(linear, rank=2, alpha=3.0, key=jax.random.key(1))
    adapter = LoraAdapter(
        adapter.lora_a, NamedArray(jnp.arange(12.0).reshape(2, 2, 3) / 10, adapter.lora_b.axes), 3.0
    )
    x = NamedArray(jax.random.normal(jax.random.key(2), (5, 6)), (Axis("pos", 5), Embed))
    got = LoraLinear.wrap(linear, adapter)(x).array
    assert linear.bias is not None
    w, b = np.asarray(linear.weight.array).reshape(6, 6), np.asarray(linear.bias.array).reshape(6)
    a, bb = np.asarray(adapter.lora_a.array), np.asarray(adapter.lora_b.array).reshape(2, 6)
    expected = np.asarray(x.array) @ w + b + (np.asarray(x.array) @ a @ bb) * 3.0 / 2
    # the width's 6 products, the rank's 2, the bias and the adapter's additions and its scale, at the
    # addends' size (the entries of x @ w + b + x @ a @ b may cancel)
    ax = np.abs(np.asarray(x.array, np.float64))
    addends = ax @ np.abs(w) + np.abs(b) + (ax @ np.abs(a) @ np.abs(bb)) * 3.0 / 2
    bound = summation_tolerance(addends, 6 + 2 + 2 + 2)
    np.testing.assert_allclose(np.asarray(got).reshape(5, 6), expected, atol=bound, rtol=0)


def test_fresh_adapters_follow_peft_init_and_leave_the_model_unchanged() -> None:
    adapters = init_lora(
        _base(), LoraConfig(rank=8, target_modules=("q_proj", "down_proj")), key=jax.random.key(1)
    )
    q, down = adapters["q_proj"], adapters["down_proj"]
    assert [a.name for a in q.lora_a.axes] == ["layers", "embed", RANK]
    assert [a.name for a in q.lora_b.axes] == ["layers", RANK, "heads", "head_size"]
    assert [a.name for a in down.lora_a.axes] == ["layers", "mlp", RANK]
    for adapter, fan_in in ((q, 32), (down, 48)):  # kaiming_uniform(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))
        values = np.asarray(adapter.lora_a.array)
        assert np.abs(values).max() <= 1 / math.sqrt(fan_in) and np.abs(values).max() > 0.8 / math.sqrt(
            fan_in
        )
        assert not np.asarray(adapter.lora_b.array).any()
    assert not np.array_equal(q.lora_a.array[0], q.lora_a.array[1]), "each layer draws its own A"
    tokens = random_tokens(2, 7)
    np.testing.assert_array_equal(with_lora(_base(), adapters)(tokens).array, _base()(tokens).array)


def test_merging_removing_and_reading_adapters() -> None:
    model = with_lora(_base(), _adapters())
    tokens = random_tokens(2, 7)
    logits = np.asarray(model(tokens).array)
    assert np.abs(logits - np.asarray(_base()(tokens).array)).max() > 0.1
    merged = merge_lora(model)
    assert type(merged.layers.stacked.attention.q_proj) is Linear
    # merged, the adapters' products are added to the weights before the sums instead of after them
    atol = summation_tolerance(logits, decoder_terms(tiny("llama"), 7) + ADAPTER_TERMS)
    np.testing.assert_allclose(np.asarray(merged(tokens).array), logits, atol=atol, rtol=0)
    np.testing.assert_array_equal(without_lora(model)(tokens).array, _base()(tokens).array)
    assert sorted(lora_params(model)) == sorted(ALL) and lora_params(_base()) == {}


def test_a_target_the_family_lacks_is_one_line_listing_the_valid_ones() -> None:
    gpt2 = tiny("gpt2").init(jax.random.key(0))
    with pytest.raises(
        ValueError,
        match=r"'gate_proj' is not a linear layer of a gpt2 model; valid: q_proj, k_proj, v_proj, o_proj, up_proj, down_proj$",
    ):
        add_lora(gpt2, LoraConfig(rank=2, target_modules=("gate_proj",)), key=jax.random.key(0))
    with pytest.raises(ValueError, match="unknown 'qkv'; use some of q_proj, k_proj"):
        LoraConfig(rank=2, target_modules=("qkv",))


def _adapter_loss(base, adapters, batch=BATCH, key=None):
    if key is not None:
        adapters = with_dropout_keys(adapters, key)
    return with_lora(base, adapters).loss(batch)[0]


@eqx.filter_jit
def _loss_and_grads(base, adapters):
    return jax.value_and_grad(_adapter_loss, argnums=1)(base, adapters)


def _flat(tree) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def test_unrolled_and_rematerialised_layers_give_the_scanned_loss_and_gradients() -> None:
    loss, grads = _loss_and_grads(_base(), _adapters())
    assert all(np.abs(g).max() > 0 for g in _flat(grads)), "every A and B gets a gradient"
    for changes in (dict(scan_layers=False), dict(remat="full")):
        other = tiny("llama", **changes).init(jax.random.key(0))
        other_loss, other_grads = _loss_and_grads(other, _adapters())
        assert_loss_and_grads_close((other_loss, _flat(other_grads)), (loss, _flat(grads)), TRAIN_TERMS)


def test_dropout_masks_come_from_the_key() -> None:
    base = _base()
    adapters = {n: LoraAdapter(a.lora_a, a.lora_b, a.alpha, 0.5) for n, a in _adapters().items()}
    loss = jax.jit(_adapter_loss)
    first, again = loss(base, adapters, key=jax.random.key(7)), loss(base, adapters, key=jax.random.key(7))
    other = loss(base, adapters, key=jax.random.key(8))
    without_keys = loss(base, adapters)  # evaluation: no keys, no dropout
    assert float(first) == float(again)
    assert float(first) != float(other) and float(first) != float(without_keys)
    # without keys no dropout is traced: the same program as the adapters without dropout, bit for bit
    assert float(without_keys) == float(loss(base, _adapters()))
    keyed = with_dropout_keys(adapters, jax.random.key(7))["q_proj"]
    assert keyed.dropout_key is not None and keyed.dropout_key.shape[0] == 2  # one key per layer
    assert with_dropout_keys(_adapters(), jax.random.key(7))["q_proj"].dropout_key is None  # rate 0: none


def _mesh(**sizes: int) -> jax.sharding.Mesh:
    return MeshSpec(**(sizes if jax.device_count() >= 8 else {n: 1 for n in sizes})).build()


@pytest.mark.parametrize(
    ("layout_name", "mesh_sizes"),
    [("fsdp", dict(fsdp=8, data=1)), ("tensor_parallel", dict(tensor=2, data=4))],
)
def test_sharded_adapters_give_the_single_device_loss_and_gradients(
    layout_name: str, mesh_sizes: dict
) -> None:
    expected_loss, expected_grads = _loss_and_grads(_base(), _adapters())
    layout = Layout.preset(layout_name, min_shard=0, tolerance=1.0)
    mesh = _mesh(**mesh_sizes)
    base = init_sharded(tiny("llama").init, layout, mesh, jax.random.key(0))
    shardings = layout.shardings(_adapters(), mesh)
    adapters = jax.device_put(_adapters(), shardings)
    for name, adapter in adapters.items():  # lora_rank is never split; A and B follow the base weight
        for array in (adapter.lora_a, adapter.lora_b):
            assert array.array.sharding.spec[array.axis_index(RANK)] is None, name
    split = [leaf for leaf in jax.tree.leaves(adapters) if len(leaf.sharding.device_set) > 1]
    assert jax.device_count() < 8 or any(
        leaf.sharding.shard_shape(leaf.shape) != leaf.shape for leaf in split
    )
    with use_layout(layout, mesh):
        loss, grads = _loss_and_grads(base, adapters)
    # the devices' partial sums add up in another order than one device's
    assert_loss_and_grads_close((loss, _flat(grads)), (expected_loss, _flat(expected_grads)), TRAIN_TERMS)
