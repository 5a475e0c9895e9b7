"""``train --config`` with ``trainer.watch``: per module and per layer norms equal numpy's on the run's own
checkpoints (1 device and an FSDP mesh of 8), the gradient's and what the layers report equal the same
figures computed outside the step, in metrics.jsonl, TensorBoard and wandb at the watched steps."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, decoder_terms, summation_tolerance, training_terms
from tracker_files import read_tensorboard_scalars, read_when_flushed
from trainer_fixtures import TINY, load_config, write_config

import halyard.named as hn
from halyard.models import LlamaConfig
from halyard.named import is_named
from halyard.train.config.errors import ConfigError
from halyard.train.data_assembly.run_data import prepare_data
from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.run.setup import RunSetup
from halyard.train.trackers.jsonl import read_jsonl
from halyard.train.trackers.wandb_offline import offline_run_files
from halyard.train.trainer.preflight import check_shapes
from halyard.train.trainer.trainer import Trainer

MODEL = LlamaConfig(**{name: value for name, value in TINY["model"].items() if name != "type"})
ROWS, SEQ_LEN = TINY["trainer"]["batch_size"], TINY["data"]["seq_len"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("watch-cache")


def sums_of_squares(tree, prefix: str) -> tuple[dict[str, float], dict[str, int]]:
    """The sums of squares of ``prefix`` (all), ``prefix/<module>``, ``prefix/<module>/layers/<i>`` and
    ``prefix/layers/<i>`` with numpy (float64), and how many squares each sums."""
    squares: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_named)[0]:
        names = [str(getattr(entry, "name", getattr(entry, "key", ""))) for entry in path]
        names = [name for name in names if name != "stacked"]
        module = ".".join(names[:-1])
        array = np.asarray(leaf.array if is_named(leaf) else leaf, np.float64)
        for name in (f"{prefix}/{module}", prefix):
            squares[name] += float(np.sum(array**2))
            counts[name] += array.size
        if is_named(leaf) and leaf.axes[0].name == "layers":
            for index in range(array.shape[0]):
                for name in (f"{prefix}/{module}/layers/{index}", f"{prefix}/layers/{index}"):
                    squares[name] += float(np.sum(array[index] ** 2))
                    counts[name] += array[index].size
    return squares, counts


def assert_norms_of(
    logged: dict, tree, prefix: str, layers_only: bool = False, rounded: int = 0, total: bool = True
) -> None:
    """The logged norms of ``tree``'s arrays (those the step saw, from its checkpoint) equal numpy's to the
    order of their float32 sums of squares (and the square root); ``layers_only``: ``prefix`` and
    ``prefix/layers/<i>`` only; ``rounded``: the roundings each element took in float32 before (relative,
    its own size); ``total``: ``prefix`` itself too."""
    squares, counts = sums_of_squares(tree, prefix)
    kept = lambda name: not layers_only or name == prefix or name.startswith(f"{prefix}/layers/")
    expected = {name: value for name, value in squares.items() if kept(name) and (total or name != prefix)}
    assert expected, "nothing to compare"
    for name, value in expected.items():
        norm = float(np.sqrt(value))
        bound = summation_tolerance(norm, counts[name] + FUNCTION_TERMS + rounded)
        assert logged[name] == pytest.approx(norm, rel=0, abs=bound), name


def assert_gradient_norms(logged: dict, grads) -> None:
    """The step's gradient norms against those of ``grads``, computed outside the step (another program):
    each gradient element within `training_terms` at the largest gradient's size (as
    float_tolerance.assert_loss_and_grads_close holds them), so a norm of ``n`` of them within ``sqrt(n)``
    times that, plus its own squares and root."""
    squares, counts = sums_of_squares(grads, "grad_norm")
    scale = max(float(np.max(np.abs(np.asarray(leaf)))) for leaf in jax.tree_util.tree_leaves(grads))
    element = summation_tolerance(scale, training_terms(MODEL, ROWS, SEQ_LEN))
    for name, value in squares.items():
        norm = float(np.sqrt(value))
        bound = np.sqrt(counts[name]) * element + summation_tolerance(norm, counts[name] + FUNCTION_TERMS)
        assert logged[name] == pytest.approx(norm, rel=0, abs=bound), name


def assert_reports_close(logged: dict, reported: dict[str, float]) -> None:
    """What the layers report in the step against the same reports of a forward outside it: the forward's
    sums (`decoder_terms`) at each figure's size; an rms adds its mean over the batch's values and the root."""
    assert reported, "nothing to compare"
    for name, value in reported.items():
        terms = decoder_terms(MODEL, SEQ_LEN) + MODEL.vocab_size
        if "/rms/" in name:
            terms += ROWS * SEQ_LEN * MODEL.shape.embed + FUNCTION_TERMS
        assert logged[name] == pytest.approx(value, rel=0, abs=summation_tolerance(value, terms)), name


@pytest.mark.parametrize(
    "devices, trainer",
    [
        (1, {}),
        (8, {"layout": "fsdp", "min_shard": 1, "mesh": {"data": 1, "fsdp": 8}}),
    ],
    ids=["1-device", "fsdp-8"],
)
def test_watched_statistics_equal_the_checkpoints_and_values_computed_outside(
    tmp_path: Path, cache_dir: Path, devices: int, trainer: dict, offline_wandb
) -> None:
    path = write_config(
        tmp_path / "watch.yaml",
        tmp_path / "run",
        cache_dir,
        trainer={"steps": 4, "log_every": 10, "watch": {"every": 2}, **trainer},
        checkpoint={"every_steps": 1},
        trackers=[{"type": "jsonl"}, {"type": "tensorboard"}, {"type": "wandb", "mode": "offline"}],
    )
    # `Trainer.fit` (what `train` runs) in this process, on the first ``devices`` of its 8
    Trainer(load_config(path), devices=jax.devices()[:devices]).fit()
    lines = {line["step"]: line for line in read_jsonl(tmp_path / "run" / "metrics.jsonl")}
    assert sorted(lines) == [1, 2, 4] and "grad_norm/layers/0" not in lines[1]

    config = load_config(path)
    restorer = Trainer(config)
    before, after = restorer.restore_state(3), restorer.restore_state(4)
    logged = lines[4]
    assert_norms_of(logged, after.params, "param_norm")  # param_norm itself included
    change = jax.tree.map(
        lambda new, old: np.asarray(new, np.float64) - np.asarray(old, np.float64),
        after.params,
        before.params,
    )
    # the step's change is a float32 subtraction (one rounding of each element); the global update_norm is
    # optax's update, not the change
    assert_norms_of(logged, change, "update_norm", rounded=1, total=False)
    adam = after.opt_state[1]  # adamw's chain: its scale_by_adam state holds the first and second moments
    for field in ("mu", "nu"):
        assert_norms_of(logged, getattr(adam, field), f"opt_state_norm/{field}", layers_only=True)

    # The gradient and the reports of step 4, computed outside the step from checkpoint 3 and step 4's batch.
    data = prepare_data(config.data, tmp_path / "run", progress=False, init=config.trainer.init)
    batch = {
        name: jnp.asarray(value) for name, value in data.train.batch(3, config.trainer.batch_size).items()
    }
    loss_fn = lm_loss_fn(config.trainer.z_loss_weight, per_example=True)

    def mean_loss(params):
        loss_sum, stats = loss_fn(params, batch, None)
        return loss_sum / stats["num_tokens"]

    (_, reports), grads = jax.jit(jax.value_and_grad(hn.collect_reports(mean_loss), has_aux=True))(
        before.params
    )
    assert_gradient_norms(logged, grads)
    reported = {}
    for name, value in reports.finished().items():
        for index, number in enumerate(np.atleast_1d(np.asarray(value))):
            reported[f"{name}/{index}" if np.ndim(value) else name] = float(number)
    assert {"activation/rms/layers/1", "attention/logit_max/layers/1", "logits/max"} <= set(reported)
    assert_reports_close(logged, reported)

    scalars = read_tensorboard_scalars(tmp_path / "run" / "tensorboard")
    (wandb_file,) = offline_run_files(tmp_path / "run")
    wandb_rows = {row["_step"]: row for row in read_when_flushed(wandb_file)["history"] if "_step" in row}
    for name in (
        "activation/rms/layers/1",
        "attention/logit_max/layers/0",
        "grad_norm/layers/1",
        "logits/max",
    ):
        bound = summation_tolerance(logged[name], 1)  # at most a rounding to float32
        assert dict(scalars[name])[4] == pytest.approx(logged[name], rel=0, abs=bound)
        assert wandb_rows[4][name] == pytest.approx(logged[name], rel=0, abs=bound)
        assert sorted(dict(scalars[name])) == [2, 4]


@pytest.mark.parametrize(
    "trainer, message",
    [
        ({"invariant": True}, "trainer.watch.model needs trainer.invariant false"),
        (
            {"mesh": {"data": 4, "stage": 2}, "min_shard": 1},
            "trainer.watch.model does not reach inside a pipeline",
        ),
    ],
)
def test_model_reports_are_refused_where_the_step_cannot_carry_them(
    tmp_path: Path, trainer: dict, message: str
) -> None:
    model = {"pipeline_microbatches": 2} if "mesh" in trainer else {}
    path = write_config(
        tmp_path / "c.yaml",
        tmp_path / "run",
        tmp_path / "cache",
        trainer={"watch": {"every": 2}, **trainer},
        model=model,
    )
    with pytest.raises(ConfigError, match=message):
        check_shapes(RunSetup(load_config(path)))
    norms_only = RunSetup(load_config(path, "--trainer.watch.model", "false"))
    check_shapes(norms_only)
    assert norms_only._watch().model is False and RunSetup(load_config(path))._watch().model is False


# A GRPO run's watched steps: test_grpo_trainer.py, test_a_grpo_run_watches_its_steps_too (on its nucleus run).
