"""A checkpoint written on an FSDP mesh of 8 devices restores onto 1 device and onto a TP mesh."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from halyard.named import Axis, NamedArray
from halyard.train.checkpoint.discovery import latest_complete
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.restore import restore

Embed, Mlp = Axis("embed", 16), Axis("mlp", 32)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 simulated devices (XLA_FLAGS)")


def as_numpy(leaf):
    if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(leaf))
    return np.asarray(leaf)


def fsdp_state() -> dict:
    """A params + AdamW state + key tree sharded over all 8 devices along `embed` (FSDP)."""
    mesh = jax.make_mesh((8,), ("fsdp",))
    by_embed = NamedSharding(mesh, P("fsdp", None))
    w_in = jax.device_put(jax.random.normal(jax.random.key(1), (Embed.size, Mlp.size)), by_embed)
    params = {
        "w_in": NamedArray(w_in, (Embed, Mlp)),
        "bias": NamedArray(jnp.arange(Mlp.size, dtype=jnp.float32), (Mlp,)),
    }
    optimizer = optax.adamw(1e-2)
    opt_state = optimizer.init(params)
    _, opt_state = optimizer.update(jax.tree.map(jnp.cos, params), opt_state, params)
    state = {"params": params, "opt_state": opt_state, "key": jax.random.key(5), "step": 11}
    assert state["params"]["w_in"].array.sharding.spec == P("fsdp", None)
    return state


def with_shardings(abstract: dict, sharding_for) -> dict:
    return jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding_for(leaf)), abstract
    )


def assert_values(restored: dict, expected: dict) -> None:
    flat_restored = jax.tree.leaves(restored)
    flat_expected = jax.tree.leaves(expected)
    assert len(flat_restored) == len(flat_expected)
    for got, want in zip(flat_restored, flat_expected):
        assert as_numpy(got).tobytes() == as_numpy(want).tobytes()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    root = tmp_path_factory.mktemp("fsdp_run")
    state = fsdp_state()
    with CheckpointManager(root) as manager:
        manager.save(11, state, wait=True)
    return root / "step_00000011", jax.eval_shape(lambda: state), state


def test_fsdp_checkpoint_restores_onto_one_device(saved: tuple[Path, dict, dict]) -> None:
    path, abstract, expected = saved
    one_device = SingleDeviceSharding(jax.devices()[0])
    restored = restore(path, with_shardings(abstract, lambda leaf: one_device)).state
    assert_values(restored, expected)
    assert restored["params"]["w_in"].array.sharding == one_device
    assert restored["params"]["w_in"].array.addressable_shards[0].data.shape == (Embed.size, Mlp.size)


def test_fsdp_checkpoint_restores_onto_a_tensor_parallel_mesh(saved: tuple[Path, dict, dict]) -> None:
    path, abstract, expected = saved
    mesh = jax.make_mesh((2, 4), ("data", "tensor"))

    def tensor_parallel(leaf: jax.ShapeDtypeStruct) -> NamedSharding:
        # Shard the mlp dimension (the last one of w_in and the bias) over `tensor`; replicate the rest.
        if leaf.shape and leaf.shape[-1] == Mlp.size:
            return NamedSharding(mesh, P(*([None] * (len(leaf.shape) - 1)), "tensor"))
        return NamedSharding(mesh, P())

    restored = restore(path, with_shardings(abstract, tensor_parallel)).state
    assert_values(restored, expected)
    w_in = restored["params"]["w_in"].array
    assert w_in.sharding.spec == P(None, "tensor")
    assert {shard.data.shape for shard in w_in.addressable_shards} == {(Embed.size, Mlp.size // 4)}

    # Training continues on the new mesh: the next AdamW update equals the one on the original FSDP mesh.
    def next_update(state: dict) -> dict:
        optimizer = optax.adamw(1e-2)
        updates, _ = jax.jit(optimizer.update)(
            jax.tree.map(jnp.cos, state["params"]), state["opt_state"], state["params"]
        )
        return updates

    # bitwise: the restored state has the saved bits (above), and AdamW's update is element-wise
    for got, want in zip(jax.tree.leaves(next_update(restored)), jax.tree.leaves(next_update(expected))):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_shardings_argument_overrides_the_target(saved: tuple[Path, dict, dict], tmp_path: Path) -> None:
    path, abstract, expected = saved
    device = SingleDeviceSharding(jax.devices()[3])
    restored = restore(path, abstract, device).state
    assert restored["params"]["w_in"].array.sharding == device
    assert_values(restored, expected)
    assert latest_complete(path.parent) == 11


def test_a_tree_of_shardings_places_each_leaf(saved: tuple[Path, dict, dict]) -> None:
    path, abstract, expected = saved
    first, last = SingleDeviceSharding(jax.devices()[0]), SingleDeviceSharding(jax.devices()[7])
    shardings = jax.tree_util.tree_map_with_path(
        lambda path, leaf: last if "['params']['bias']" in jax.tree_util.keystr(path) else first, abstract
    )
    restored = restore(path, abstract, shardings).state
    assert restored["params"]["bias"].array.sharding == last
    assert restored["params"]["w_in"].array.sharding == first
    assert_values(restored, expected)
    with pytest.raises(ValueError, match="shardings tree does not have the target's structure"):
        restore(path, abstract, {"params": first})
