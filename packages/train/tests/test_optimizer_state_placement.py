"""The optimizer state's dtype (``model.optimizer_dtype``, the precision policy's third dtype) and place
(``trainer.offload_optimizer_state``): bfloat16 weights with float32 Adam moments, and the state kept in
pinned host memory between steps, through the Trainer (`Trainer.fit`, what `train` runs) and unit by unit."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trainer_fixtures import load_config, run_losses, write_config

import halyard.train.run.setup as run_setup
from halyard.models import model_config
from halyard.train.config.errors import ConfigError
from halyard.train.optim.config import AdamWConfig
from halyard.train.optim.state_placement import with_state_dtype
from halyard.train.run.setup import RunSetup
from halyard.train.trainer.trainer import Trainer


def test_the_state_dtype_wrapper_runs_the_optimizer_in_float32_and_rounds_the_update_once() -> None:
    optimizer = AdamWConfig(learning_rate=1e-3, weight_decay=0.1).build(total_steps=10)
    rng = np.random.default_rng(0)
    params32 = {"w": jnp.asarray(rng.normal(size=(64, 64)), jnp.float32), "b": jnp.zeros((64,))}
    params16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params32)
    grads16 = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.bfloat16), params32)
    wrapped = with_state_dtype(optimizer, jnp.float32)
    state = wrapped.init(params16)
    assert {leaf.dtype for leaf in jax.tree.leaves(state) if leaf.ndim} == {jnp.dtype(jnp.float32)}
    updates, state = wrapped.update(grads16, state, params16)
    assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(updates))
    # The same arithmetic in float32 on the bf16 values, rounded once at the end.
    wide = jax.tree.map(lambda x: x.astype(jnp.float32), (grads16, params16))
    expected, _ = optimizer.update(wide[0], optimizer.init(wide[1]), wide[1])
    for got, want in zip(jax.tree.leaves(updates), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.bfloat16)))
    # Without the wrapper the moments would be bfloat16.
    plain = optimizer.init(params16)
    assert jnp.dtype(jnp.bfloat16) in {leaf.dtype for leaf in jax.tree.leaves(plain) if leaf.ndim}


def test_train_keeps_bfloat16_weights_with_float32_moments(tmp_path: Path) -> None:
    model = {"param_dtype": "bfloat16", "optimizer_dtype": "float32", "compute_dtype": "bfloat16"}
    path = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache", model=model)
    result = Trainer(load_config(path)).fit()
    params = jax.tree.leaves(result.state.params)
    moments = [leaf for leaf in jax.tree.leaves(result.state.opt_state) if leaf.ndim]
    assert {leaf.dtype for leaf in params} == {jnp.dtype(jnp.bfloat16)}
    assert {leaf.dtype for leaf in moments} == {jnp.dtype(jnp.float32)}
    losses = run_losses(tmp_path / "run")
    assert len(losses) == 6 and all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_offloaded_optimizer_state_lives_in_pinned_host_memory_and_trains_the_same(tmp_path: Path) -> None:
    if not run_setup.offload_supported(jax.devices()[0]):
        pytest.skip(f"JAX's {jax.default_backend()} backend here has no pinned_host memory")
    runs = {}
    for offload in (False, True):
        folder = tmp_path / f"offload_{offload}"
        folder.mkdir()
        trainer = {"offload_optimizer_state": offload}
        path = write_config(folder / "run.yaml", folder / "run", tmp_path / "cache", trainer=trainer)
        config = load_config(path)
        if offload:
            shardings = RunSetup(config).abstract_state.shardings
            kinds = {s.memory_kind for s in jax.tree.leaves(shardings.opt_state)}
            assert kinds == {"pinned_host"}
            assert {s.memory_kind for s in jax.tree.leaves(shardings.params)} == {"device"}
        # `Trainer.fit` (what `train` runs) in this process, on one of its devices: no process start each
        Trainer(config, devices=jax.devices()[:1]).fit()
        runs[offload] = run_losses(folder / "run")
    # The same arithmetic, only the state's memory differs (on CPU both memories are the same RAM).
    assert runs[True] == runs[False] and len(runs[True]) == 6
    # A resume restores the saved state into host memory and goes on.
    path = tmp_path / "offload_True" / "run.yaml"
    Trainer(load_config(path, "--trainer.steps", "8"), devices=jax.devices()[:1]).fit()
    losses = run_losses(tmp_path / "offload_True" / "run")
    assert len(losses) == 8 and all(np.isfinite(losses))


def test_offload_without_pinned_host_memory_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_setup, "offload_supported", lambda device: False)
    path = write_config(
        tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache", trainer={"offload_optimizer_state": True}
    )
    with pytest.raises(
        ConfigError, match="trainer.offload_optimizer_state: the cpu device has no pinned_host"
    ):
        RunSetup(load_config(path)).abstract_state  # noqa: B018


def test_a_bad_optimizer_dtype_names_the_key() -> None:
    with pytest.raises(ValueError, match="LlamaConfig.optimizer_dtype='float33' is not a dtype name"):
        model_config("llama", optimizer_dtype="float33")
