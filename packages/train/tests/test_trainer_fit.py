"""The Trainer end to end on a tiny Llama: determinism, resume, resharding, preemption, config errors."""

from __future__ import annotations

import json
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest
from trainer_fixtures import StopAfter, assert_bitwise_equal, load_config, write_config

from halyard.train.trainer.trainer import Trainer


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-cache")


def test_same_config_twice_gives_identical_bits(tmp_path: Path, cache_dir: Path) -> None:
    results = []
    for name in ("first", "second"):
        # The first run also writes a profiler trace of steps 2-3: tracing must not change the bits.
        profile = {"profile_start": 2, "profile_steps": 2} if name == "first" else {}
        config = load_config(
            write_config(tmp_path / f"{name}.yaml", tmp_path / name, cache_dir, trainer=profile)
        )
        results.append(Trainer(config).fit())
    assert [h["loss"] for h in results[0].history] == [h["loss"] for h in results[1].history]
    assert_bitwise_equal(results[0].state.params, results[1].state.params)
    losses = [h["loss"] for h in results[0].history]
    assert len(losses) == 6 and losses[-1] < losses[0]
    lines = (tmp_path / "first" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert (tmp_path / "first" / "config.yaml").exists()
    assert list((tmp_path / "first" / "profile").rglob("*.xplane.pb")), "no profiler trace written"
    assert not (tmp_path / "second" / "profile").exists()
    assert not (tmp_path / "first" / "loss.png").exists()  # trainer.plot: false (the tiny runs' setting)


def test_preempted_run_resumes_to_the_same_bits(tmp_path: Path, cache_dir: Path) -> None:
    whole = load_config(write_config(tmp_path / "whole.yaml", tmp_path / "whole", cache_dir))
    reference = Trainer(whole).fit()
    split = load_config(write_config(tmp_path / "split.yaml", tmp_path / "split", cache_dir))
    with pytest.raises(SystemExit) as stopped:
        Trainer(split, preemption=StopAfter(4)).fit()
    assert stopped.value.code == 143
    assert Trainer(split).restore_state().step == 4
    resumed = Trainer(split).fit()
    assert int(resumed.state.step) == 6
    assert_bitwise_equal(reference.state.params, resumed.state.params)
    assert_bitwise_equal(reference.state.opt_state, resumed.state.opt_state)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in reference.history][4:]


# kill -9 of a `train` process at random moments, then resumed to the uninterrupted run's bits (parameters and
# optimizer state, and every checkpoint between), and SIGTERM saving a checkpoint and exiting with 143 (that
# checkpoint the uninterrupted run's bits at its step, the run resumed to its end):
# tests/reliability/test_training_kill.py.


def test_fsdp_checkpoint_restores_on_a_tensor_parallel_mesh_and_on_one_device(
    tmp_path: Path, cache_dir: Path
) -> None:
    wide = {"hidden_size": 64}
    source = write_config(
        tmp_path / "fsdp.yaml",
        tmp_path / "fsdp",
        cache_dir,
        model=wide,
        trainer={"steps": 2, "layout": "fsdp", "min_shard": 1, "mesh": {"data": 1, "fsdp": 8}},
    )
    trained = Trainer(load_config(source)).fit()
    embedding_sharding = [leaf.sharding for leaf in jax.tree_util.tree_leaves(trained.state.params)]
    assert any(len(s.device_set) == 8 and not s.is_fully_replicated for s in embedding_sharding)

    # Same weights on a tensor-parallel mesh: a run whose last step is the checkpoint's restores only.
    tp = write_config(
        tmp_path / "tp.yaml",
        tmp_path / "tp",
        cache_dir,
        model=wide,
        trainer={
            "steps": 2,
            "layout": "tensor_parallel",
            "min_shard": 1,
            "mesh": {"data": 4, "tensor": 2},
            "init": f"checkpoint:{tmp_path / 'fsdp'}",
        },
    )
    restored = Trainer(load_config(tp)).fit()
    assert_bitwise_equal(trained.state.params, restored.state.params)
    assert any(
        "tensor" in str(leaf.sharding.spec) for leaf in jax.tree_util.tree_leaves(restored.state.params)
    )

    # And on a single device, training on from there.
    one = write_config(
        tmp_path / "one.yaml",
        tmp_path / "one",
        cache_dir,
        model=wide,
        trainer={"steps": 3, "init": f"checkpoint:{tmp_path / 'fsdp'}"},
    )
    # `Trainer.fit` (what `train` runs) on one of this process's devices: no process start
    result = Trainer(load_config(one), devices=jax.devices()[:1]).fit()
    assert int(result.state.step) == 3
    assert [
        json.loads(line)["step"] for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()
    ] == [3]


def test_mup_models_get_per_parameter_learning_rates(tmp_path: Path, cache_dir: Path) -> None:
    mup = {
        "type": "mup",
        "vocab_size": 512,
        "hidden_size": 64,
        "d_base": 16,
        "head_dim": 8,
        "ff_multiple": 2,
        "num_layers": 2,
        "max_position": 64,
    }
    config = load_config(
        write_config(
            tmp_path / "mup.yaml",
            tmp_path / "mup",
            cache_dir,
            model=mup,
            optimizer={
                "weight_decay": 0.0,
                "max_grad_norm": None,
                "schedule": {"type": "constant", "warmup": 0},
            },
        )
    )
    trainer = Trainer(config)
    # AdamW without weight decay: the first update does not depend on the weights, so zeros of the model's
    # shapes serve, and no initialisation is compiled for it (fit below compiles its own).
    abstract = eqx.filter_eval_shape(config.model.init, jax.random.PRNGKey(0))
    model = jax.tree.map(lambda leaf: jax.numpy.zeros(leaf.shape, leaf.dtype), abstract)
    optimizer = trainer.setup.optimizer
    ones = jax.tree.map(jax.numpy.ones_like, model)
    updates, _ = optimizer.update(ones, optimizer.init(model), model, loss_fn=None)
    flat = {
        jax.tree_util.keystr(path): np.abs(np.asarray(leaf)).max()
        for path, leaf in jax.tree_util.tree_flatten_with_path(updates)[0]
    }
    embedding = next(v for k, v in flat.items() if "embed" in k and "unembed" not in k)
    hidden = [v for k, v in flat.items() if "proj" in k or "mlp" in k]
    assert hidden, flat.keys()
    # AdamW's first update has magnitude lr per element; hidden matrices get lr * d_base / hidden_size. The
    # same elementwise arithmetic on the same ones, scaled by 16 / 64, a power of two: exact.
    np.testing.assert_array_equal(hidden, [embedding * 16 / 64] * len(hidden))
    result = trainer.fit()
    assert result.history[-1]["loss"] < result.history[0]["loss"]
