"""A jitted train step on a toy attention + MLP model gives the same losses under every layout."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, attention_terms, summation_tolerance
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import halyard.named as hn
from halyard.named import Axis, NamedArray
from halyard.shard import Layout, MeshSpec, constrain, global_batch_from_local, init_sharded, use_layout

Batch, Pos, Embed = Axis("batch", 8), Axis("pos", 4), Axis("embed", 16)
Heads, HeadSize, Mlp, Vocab = Axis("heads", 4), Axis("head_size", 4), Axis("mlp", 32), Axis("vocab", 16)
WEIGHTS = {
    "wq": (Embed, Heads, HeadSize),
    "wk": (Embed, Heads, HeadSize),
    "wv": (Embed, Heads, HeadSize),
    "wo": (Heads, HeadSize, Embed),
    "w_in": (Embed, Mlp),
    "w_out": (Mlp, Embed),
    "unembed": (Embed, Vocab),
}
STEPS = 3
LEARNING_RATE = 0.5
# The loss's sums, which another layout adds in another order: the q/k/v projections, attention over the 4
# positions, the output projection, the MLP (tanh), the unembedding, the log-softmax over the vocabulary and
# the mean over the batch's tokens; a step's gradients go back through them and sum over those tokens.
LOSS_TERMS = (
    Embed.size
    + attention_terms(HeadSize.size, Pos.size)
    + Heads.size * HeadSize.size
    + Embed.size
    + FUNCTION_TERMS
    + Mlp.size
    + Embed.size
    + Vocab.size
    + 2 * FUNCTION_TERMS
    + Batch.size * Pos.size
)
STEP_TERMS = 2 * LOSS_TERMS + Batch.size * Pos.size


def init_model(scale: jax.Array) -> dict:
    params = {}
    for offset, (name, axes) in enumerate(WEIGHTS.items()):
        shape = tuple(a.size for a in axes)
        values = jnp.sin(jnp.arange(math.prod(shape), dtype=jnp.float32) * 0.7 + offset).reshape(shape)
        params[name] = NamedArray(scale * values / math.sqrt(axes[0].size), axes)
    return params


def loss_fn(params: dict, batch: dict) -> jax.Array:
    x = constrain(batch["x"])
    q = hn.dot(x, params["wq"], axis="embed")
    k = hn.dot(x, params["wk"], axis="embed").rename({"pos": "key_pos"})
    v = hn.dot(x, params["wv"], axis="embed").rename({"pos": "key_pos"})
    scores = constrain(hn.dot(q, k, axis="head_size") / math.sqrt(HeadSize.size))
    attention = hn.dot(hn.softmax(scores, "key_pos"), v, axis="key_pos")
    x = constrain(x + hn.dot(attention, params["wo"], axis=("heads", "head_size")))
    hidden = constrain(hn.tanh(hn.dot(x, params["w_in"], axis="embed")))
    x = constrain(x + hn.dot(hidden, params["w_out"], axis="mlp"))
    log_probs = hn.log_softmax(hn.dot(x, params["unembed"], axis="embed"), "vocab")
    return -hn.mean(hn.sum(log_probs * batch["targets"], "vocab")).array


def train_step(params: dict, batch: dict) -> tuple[dict, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss


def make_batch() -> dict:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(Batch.size, Pos.size, Embed.size)).astype(np.float32)
    targets = np.eye(Vocab.size, dtype=np.float32)[rng.integers(0, Vocab.size, size=(Batch.size, Pos.size))]
    return {
        "x": NamedArray(x, (Batch, Pos, Embed)),
        "targets": NamedArray(targets, (Batch, Pos, Vocab)),
    }


@pytest.fixture(scope="module")
def reference() -> tuple[list[float], dict]:
    """Losses and final weights on one device, without any layout."""
    params = jax.jit(init_model)(jnp.float32(1.0))
    batch = jax.tree.map(jnp.asarray, make_batch())
    step = jax.jit(train_step)
    losses = []
    for _ in range(STEPS):
        params, loss = step(params, batch)
        losses.append(float(loss))
    return losses, params


CASES = {
    "data_parallel": (MeshSpec(data=8), {"w_in": (16, 32)}),
    "fsdp": (MeshSpec(data=2, fsdp=4), {"w_in": (4, 32), "wo": (4, 4, 4)}),
    "tensor_parallel": (MeshSpec(data=2, tensor=4), {"w_in": (16, 8), "wo": (1, 4, 16), "unembed": (16, 4)}),
    "fsdp_tensor": (MeshSpec(data=1, fsdp=2, tensor=4), {"w_in": (8, 8), "wq": (8, 1, 4), "unembed": (8, 4)}),
}


@pytest.mark.parametrize("preset", list(CASES))
def test_same_losses_under_every_layout(
    devices8: list, reference: tuple[list[float], dict], preset: str
) -> None:
    mesh_spec, shard_shapes = CASES[preset]
    mesh = mesh_spec.build(devices8)
    layout = Layout.preset(preset, min_shard=0, tolerance=0.0)
    params = init_sharded(init_model, layout, mesh, jnp.float32(1.0))
    batch = global_batch_from_local(make_batch(), mesh, layout=layout)
    param_shardings = layout.shardings(params, mesh)
    with use_layout(layout, mesh):
        step = jax.jit(
            train_step, out_shardings=(param_shardings, NamedSharding(mesh, P())), donate_argnums=0
        )
        losses = []
        for _ in range(STEPS):
            params, loss = step(params, batch)
            losses.append(float(loss))

    expected_losses, expected_params = reference
    # each step's loss after the previous steps' updates, whose own differences add up
    bound = summation_tolerance(expected_losses, STEPS * STEP_TERMS)
    np.testing.assert_allclose(losses, expected_losses, atol=bound, rtol=0)
    assert losses[-1] < losses[0]  # it trains
    for name, shape in shard_shapes.items():
        assert params[name].array.addressable_shards[0].data.shape == shape, name
    for name in WEIGHTS:
        want = np.asarray(expected_params[name].array)
        bound = summation_tolerance(want, STEPS * STEP_TERMS)
        np.testing.assert_allclose(np.asarray(params[name].array), want, atol=bound, rtol=0)
