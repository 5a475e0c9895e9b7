"""The watched step: a value reported inside a remat'd layer scan under shard_map on 8 devices reaches
metrics.jsonl, TensorBoard and wandb (offline) at its step with the value computed outside the step; the same
with 2 microbatches; per-example losses in row order; norms per module and layer equal numpy's."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance
from jax.sharding import Mesh, PartitionSpec
from tracker_files import read_tensorboard_histograms, read_tensorboard_scalars, read_when_flushed

import halyard.named as hn
from halyard.named import Axis, NamedArray
from halyard.named.nn import Stacked
from halyard.train.run_config import TrainConfig, TrainerConfig
from halyard.train.step import init_state, make_train_step
from halyard.train.trackers.config import JsonlTrackerConfig, TensorBoardTrackerConfig, WandbTrackerConfig
from halyard.train.trackers.jsonl import read_jsonl
from halyard.train.trackers.wandb_offline import offline_run_files
from halyard.train.trainer.metrics_log import MetricsLog
from halyard.train.watch.config import WatchConfig

Embed, Layers, ROWS = Axis("embed", 4), Axis("layers", 3), 16
# The forward's reductions and functions up to one layer's output (float32 in the step, float64 in numpy);
# an rms adds the mean over the batch's ROWS * 4 values and the square root.
FORWARD_TERMS = Layers.size * (Embed.size + FUNCTION_TERMS)
RMS_TERMS = FORWARD_TERMS + ROWS * Embed.size + FUNCTION_TERMS


class Layer(eqx.Module):
    weight: NamedArray

    @classmethod
    def init(cls, *, key):
        return cls(NamedArray(jax.random.normal(key, (4, 4)) / 2, (Embed, Axis("out", 4))))

    def __call__(self, x):
        y = hn.tanh(hn.dot(x, self.weight, axis="embed").rename({"out": "embed"}))
        hn.report("probe/rms", jnp.sqrt(jnp.mean(jnp.square(y.array))), reduce="rms")
        hn.report("probe/max", jnp.max(y.array), reduce="max")
        return y


class Model(eqx.Module):
    layers: Stacked
    head: NamedArray


def sharded_loss_fn(mesh: Mesh):
    """``loss_fn(model, batch, key)`` whose layers run inside shard_map over the 8 devices' rows."""

    def per_device(model, rows):
        def forward():
            out = model.layers.fold(NamedArray(rows, (Axis("batch", rows.shape[0]), Embed)))
            return jnp.square(hn.dot(out, model.head, axis="embed").array)

        per_row, reports = hn.capture_reports(forward)()
        return per_row, reports.across("data")

    sharded = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(PartitionSpec(), PartitionSpec("data")),
        out_specs=(PartitionSpec("data"), PartitionSpec()),
    )

    def loss_fn(model, batch, key):
        per_row, reports = sharded(model, batch["x"])
        reports.emit()
        rows = jnp.ones_like(per_row)
        stats = {"num_tokens": rows.sum(), "example_loss": per_row, "example_tokens": rows}
        return per_row.sum(), stats

    return loss_fn


def outside(model, x):
    """(rms, max) per layer, with numpy."""
    rms, top = [], []
    h = np.asarray(x, np.float64)
    for layer in model.layers.layers():
        h = np.tanh(h @ np.asarray(layer.weight.array, np.float64))
        rms.append(np.sqrt(np.mean(h**2)))
        top.append(h.max())
    return np.array(rms), np.array(top), (h @ np.asarray(model.head.array)) ** 2


def setup(accumulation: int = 1):
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    key = jax.random.PRNGKey(0)
    model = Model(Stacked.init(Layers, Layer, key=key, remat="full"), NamedArray(jnp.ones(4) / 2, (Embed,)))
    optimizer = optax.adamw(0.05)
    steps = {
        watched: jax.jit(
            make_train_step(
                sharded_loss_fn(mesh),
                optimizer,
                accumulation=accumulation,
                watch=WatchConfig(every=2, histograms=True, histogram_bins=8) if watched else None,
            )
        )
        for watched in (False, True)
    }
    batches = [{"x": jax.random.normal(jax.random.PRNGKey(10 + s), (ROWS, 4))} for s in range(4)]
    return init_state(model, optimizer, key), steps, batches


def test_a_report_inside_a_remat_layer_scan_under_shard_map_reaches_every_tracker(tmp_path, offline_wandb):
    state, steps, batches = setup()
    trackers = [JsonlTrackerConfig(), TensorBoardTrackerConfig(), WandbTrackerConfig(project="watch")]
    trainer = TrainerConfig(
        steps=4, log_every=10, progress=False, watch=WatchConfig(every=2, histograms=True)
    )
    config = dataclasses.replace(TrainConfig(), trackers=trackers, trainer=trainer)
    log = MetricsLog(
        config,
        tmp_path,
        Mesh(np.array(jax.devices()[:8]), ("data",)),
        start_step=0,
        model_config=config.model,
    )
    expected = {}
    for step, batch in enumerate(batches, start=1):
        if step % 2 == 0:  # the values of the watched steps, from the parameters the step starts from
            expected[step] = outside(state.params, batch["x"])
            params_before = jax.tree.map(np.asarray, state.params)
        log.before_step()
        state, metrics = steps[step % 2 == 0](state, batch)
        log.after_step(step, metrics, tokens=ROWS)
        if step % 2 == 0:
            after = jax.tree.map(np.asarray, state.params)
            expected[step] += (after, jax.tree.map(np.subtract, after, params_before))
    log.close()

    lines = {line["step"]: line for line in read_jsonl(tmp_path / "metrics.jsonl")}
    assert sorted(lines) == [1, 2, 4]  # step 2 logged at its own step although log_every is 10
    scalars = read_tensorboard_scalars(tmp_path / "tensorboard")
    (wandb_file,) = offline_run_files(tmp_path)
    wandb_rows = {row["_step"]: row for row in read_when_flushed(wandb_file)["history"] if "_step" in row}
    for step, (rms, top, _, after, change) in expected.items():
        for index in range(Layers.size):
            for name, value, terms in (
                (f"probe/rms/layers/{index}", rms[index], RMS_TERMS),
                (f"probe/max/layers/{index}", top[index], FORWARD_TERMS),
            ):
                bound = summation_tolerance(value, terms + 1)  # + TensorBoard's float32
                assert lines[step][name] == pytest.approx(value, rel=0, abs=bound), name
                assert dict(scalars[name])[step] == pytest.approx(value, rel=0, abs=bound), name
                assert wandb_rows[step][name] == pytest.approx(value, rel=0, abs=bound), name
            layer_norm = np.linalg.norm(after.layers.stacked.weight.array[index])
            bound = summation_tolerance(layer_norm, 16 + FUNCTION_TERMS)  # 16 squares and a square root
            assert lines[step][f"param_norm/layers/{index}"] == pytest.approx(layer_norm, rel=0, abs=bound)
            # the step's change is the same float32 subtraction as numpy's: its norm's squares and root alone
            update = np.linalg.norm(change.layers.stacked.weight.array[index])
            bound = summation_tolerance(update, 16 + FUNCTION_TERMS)
            assert lines[step][f"update_norm/layers/{index}"] == pytest.approx(update, rel=0, abs=bound)
        head_norm = np.linalg.norm(after.head.array)
        bound = summation_tolerance(head_norm, after.head.array.size + FUNCTION_TERMS)  # its squares and root
        assert lines[step]["param_norm/head"] == pytest.approx(head_norm, rel=0, abs=bound)
    assert "probe/rms/layers/0" not in lines[1]  # step 1 was not watched
    assert [step for step, _ in scalars["probe/rms/layers/0"]] == [2, 4]
    histograms = read_tensorboard_histograms(tmp_path / "tensorboard")
    assert sorted(step for step, _, _ in histograms["param/layers"]) == [2, 4]
    assert all(counts.sum() == Layers.size * 16 for _, counts, _ in histograms["param/layers"])


def test_microbatches_combine_reports_and_keep_the_examples_in_row_order():
    results = {}
    for accumulation in (1, 2):
        state, steps, batches = setup(accumulation)
        _, metrics = steps[True](state, batches[0])
        results[accumulation] = jax.tree.map(np.asarray, metrics)
    one, two = results[1], results[2]
    _, _, per_row = outside(setup()[0].params, setup()[2][0]["x"])
    loss_bound = summation_tolerance(per_row, 2 * (FORWARD_TERMS + Embed.size))  # the head's dot, squared
    np.testing.assert_allclose(one["examples"]["loss"], per_row, atol=loss_bound, rtol=0)
    np.testing.assert_allclose(two["examples"]["loss"], one["examples"]["loss"], atol=loss_bound, rtol=0)
    np.testing.assert_array_equal(two["watch"]["probe/max/layers"], one["watch"]["probe/max/layers"])
    rms = one["watch"]["probe/rms/layers"]
    np.testing.assert_allclose(
        two["watch"]["probe/rms/layers"], rms, atol=summation_tolerance(rms, RMS_TERMS), rtol=0
    )
    # backward through the same forward, the sum over the rows, then the norm's 16 squares and square root
    norms = one["watch"]["grad_norm/layers"]
    bound = summation_tolerance(norms, 2 * (FORWARD_TERMS + Embed.size) + ROWS + 16 + FUNCTION_TERMS)
    np.testing.assert_allclose(two["watch"]["grad_norm/layers"], norms, atol=bound, rtol=0)
