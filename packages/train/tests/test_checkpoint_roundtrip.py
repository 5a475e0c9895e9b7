"""Saving and restoring a full training state bit for bit: NamedArray params, AdamW state, key, step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from halyard.named import Axis, NamedArray
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.restore import restore, restore_weights

Embed, Mlp, Vocab = Axis("embed", 16), Axis("mlp", 8), Axis("vocab", 24)


def make_state(seed: int = 0) -> dict:
    keys = jax.random.split(jax.random.key(seed), 3)
    params = {
        "embedding": NamedArray(jax.random.normal(keys[0], (Vocab.size, Embed.size)), (Vocab, Embed)),
        "blocks": [
            {"w_in": NamedArray(jax.random.normal(keys[1], (Embed.size, Mlp.size)), (Embed, Mlp))},
            {"norm": NamedArray(jnp.ones(Embed.size, jnp.bfloat16), (Embed,))},
        ],
    }
    optimizer = optax.adamw(1e-2)
    opt_state = optimizer.init(params)
    grads = jax.tree.map(lambda leaf: jnp.sin(leaf.astype(jnp.float32)).astype(leaf.dtype), params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return {
        "params": params,
        "opt_state": opt_state,
        "key": keys[2],
        "step": 7,
        "tokens_seen": np.int64(1 << 40),
    }


def assert_bitwise_equal(expected, actual) -> None:
    expected_leaves, expected_structure = jax.tree_util.tree_flatten_with_path(expected)
    actual_leaves, actual_structure = jax.tree_util.tree_flatten_with_path(actual)
    assert expected_structure == actual_structure
    for (path, want), (_, got) in zip(expected_leaves, actual_leaves):
        name = jax.tree_util.keystr(path)
        if jax.dtypes.issubdtype(getattr(want, "dtype", np.float32), jax.dtypes.prng_key):
            assert jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key), name
            want, got = jax.random.key_data(want), jax.random.key_data(got)
        assert type(want) is type(got) or isinstance(got, jax.Array), name
        want_array, got_array = np.asarray(want), np.asarray(got)
        assert want_array.dtype == got_array.dtype, name
        assert want_array.shape == got_array.shape, name
        assert want_array.tobytes() == got_array.tobytes(), name


def test_full_state_round_trips_bitwise(tmp_path: Path) -> None:
    state = make_state()
    with CheckpointManager(tmp_path) as manager:
        assert manager.save(7, state, {"data": {"seed": 3}, "config_hash": "abc"})
        manager.wait()
        restored = manager.restore(None, jax.eval_shape(lambda: state))
    assert restored.step == 7
    assert restored.extra_metadata == {"data": {"seed": 3}, "config_hash": "abc"}
    assert isinstance(restored.state["step"], int) and restored.state["step"] == 7
    assert isinstance(restored.state["params"]["embedding"], NamedArray)
    assert restored.state["params"]["embedding"].axes == (Vocab, Embed)
    assert_bitwise_equal(state, restored.state)
    # The restored key draws the same numbers as the original.
    assert np.array_equal(
        jax.random.normal(state["key"], (4,)), jax.random.normal(restored.state["key"], (4,))
    )


def test_a_relative_directory_saves_and_restores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The demo's run directory is relative (runs/demo); orbax refuses relative paths.
    monkeypatch.chdir(tmp_path)
    state = make_state()
    with CheckpointManager(Path("runs/demo/checkpoints")) as manager:
        assert manager.save(3, state, wait=True)
        restored = manager.restore(None, jax.eval_shape(lambda: state))
    assert_bitwise_equal(state, restored.state)
    explicit = restore(Path("runs/demo/checkpoints/step_00000003"), jax.eval_shape(lambda: state))
    assert_bitwise_equal(state, explicit.state)


def test_numpy_targets_restore_as_numpy(tmp_path: Path) -> None:
    state = {"counts": np.arange(5, dtype=np.int32), "weights": jnp.arange(3.0)}
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, state, wait=True)
    restored = restore(tmp_path / "step_00000001", {"counts": np.zeros(5, np.int32), "weights": jnp.zeros(3)})
    assert isinstance(restored.state["counts"], np.ndarray)
    assert_bitwise_equal(state, restored.state)


def test_weights_only_restore_reads_the_params_subtree(tmp_path: Path) -> None:
    state = make_state()
    with CheckpointManager(tmp_path) as manager:
        manager.save(7, state, wait=True)
        params = manager.restore_weights(7, jax.eval_shape(lambda: state["params"]), params_path="['params']")
    assert_bitwise_equal(state["params"], params)
    with pytest.raises(ValueError, match=r"no leaf under '\.params'.*\['opt_state'\]"):
        restore_weights(tmp_path / "step_00000007", params, params_path=".params")
    # A bare name finds the dict key (or the attribute of a dataclass / equinox state).
    by_name = restore_weights(
        tmp_path / "step_00000007", jax.eval_shape(lambda: state["params"]), params_path="params"
    )
    assert_bitwise_equal(state["params"], by_name)


@dataclasses.dataclass
class ModuleLikeState:
    params: dict
    params_ema: dict


jax.tree_util.register_dataclass(ModuleLikeState, data_fields=["params", "params_ema"], meta_fields=[])


def test_weights_only_restore_of_an_attribute_ignores_siblings_sharing_its_prefix(tmp_path: Path) -> None:
    state = ModuleLikeState(params={"w": jnp.arange(3.0)}, params_ema={"w": jnp.zeros(3)})
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, state, wait=True)
    target = {"w": jax.ShapeDtypeStruct((3,), jnp.float32)}
    for params_path in ("params", ".params"):
        params = restore_weights(tmp_path / "step_00000001", target, params_path=params_path)
        assert np.array_equal(np.asarray(params["w"]), np.arange(3.0))
    ema = restore_weights(tmp_path / "step_00000001", target, params_path="params_ema")
    assert np.array_equal(np.asarray(ema["w"]), np.zeros(3))


def test_a_state_that_differs_from_the_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    state = make_state()
    with CheckpointManager(tmp_path) as manager:
        manager.save(7, state, wait=True)
    path = tmp_path / "step_00000007"
    abstract = jax.eval_shape(lambda: state)
    missing = {**abstract, "extra": jax.ShapeDtypeStruct((2,), jnp.float32)}
    with pytest.raises(ValueError, match=r"not in the checkpoint \[\"\['extra'\]\"\]"):
        restore(path, missing)
    small = NamedArray(jax.ShapeDtypeStruct((2, 16), jnp.float32), (Axis("vocab", 2), Embed))
    wrong_shape = {**abstract, "params": {**abstract["params"], "embedding": small}}
    with pytest.raises(ValueError, match=r"Shape mismatch at \['params'\]\['embedding'\].* \(24, 16\)"):
        restore(path, wrong_shape)
    wrong_dtype = {**abstract, "key": jax.ShapeDtypeStruct((2,), jnp.uint32)}
    with pytest.raises(ValueError, match=r"typed PRNG key at \['key'\]"):
        restore(path, wrong_dtype)
    as_bf16 = jax.tree.map(lambda leaf: leaf, abstract)
    as_bf16["params"]["blocks"][0]["w_in"] = NamedArray(
        jax.ShapeDtypeStruct((16, 8), jnp.bfloat16), (Embed, Mlp)
    )
    with pytest.raises(ValueError, match=r"Dtype mismatch at .*w_in.*float32, the target bfloat16"):
        restore(path, as_bf16)


def test_unsupported_leaves_and_metadata_are_refused_before_writing(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path) as manager:
        with pytest.raises(TypeError, match=r"leaf at \['name'\] is a str"):
            manager.save(1, {"w": jnp.ones(2), "name": "llama"})
        with pytest.raises(TypeError, match="extra_metadata must be JSON"):
            manager.save(1, {"w": jnp.ones(2)}, {"bad": object()})
    assert not list(tmp_path.iterdir())


def test_saved_arrays_may_be_donated_as_soon_as_save_returns(tmp_path: Path) -> None:
    params = {"w": jnp.arange(4096.0).reshape(64, 64)}
    expected = np.asarray(params["w"]).copy()
    overwrite = jax.jit(lambda tree: jax.tree.map(lambda leaf: leaf * 0 - 1, tree), donate_argnums=0)
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, params)
        params = overwrite(params)  # training continues on the same buffers
        manager.wait()
        restored = manager.restore(1, jax.eval_shape(lambda: params))
    assert np.array_equal(np.asarray(restored.state["w"]), expected)
    assert np.all(np.asarray(params["w"]) == -1)


def test_saving_a_step_twice_is_a_no_op(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path) as manager:
        assert manager.save(3, {"w": jnp.ones(2)}, wait=True)
        assert not manager.save(3, {"w": jnp.zeros(2)}, wait=True)
        restored = manager.restore(3, {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})
    assert np.array_equal(np.asarray(restored.state["w"]), np.ones(2))


def test_compressed_checkpoints_restore_the_same_bits_and_are_smaller(tmp_path: Path) -> None:
    state = {"w": jnp.zeros((256, 256)), "v": jnp.arange(1000.0)}  # zeros compress well

    def size(root: Path) -> int:
        return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())

    for compress in (False, True):
        with CheckpointManager(tmp_path / str(compress), compress=compress) as manager:
            manager.save(1, state, wait=True)
            assert_bitwise_equal(state, manager.restore(1, jax.eval_shape(lambda: state)).state)
    assert size(tmp_path / "True") < size(tmp_path / "False") / 4
