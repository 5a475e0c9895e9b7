"""The compiled train step: accumulation equals the full batch, NaN steps are skipped, the model's dtypes hold."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from float_tolerance import summation_tolerance

from halyard.models import LlamaConfig, ModelConfig
from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.optim.state_placement import with_state_dtype
from halyard.train.plan.step_memory import CPU_PLAN_OPTIONS
from halyard.train.step import TrainState, init_state, make_train_step, split_microbatches


def toy_loss(params, batch, key):
    """Token-summed squared error of a linear map, with a mask that gives rows unequal token counts."""
    pred = batch["x"] @ params["w"] + params["b"]
    err = ((pred - batch["y"]) ** 2).sum(-1) * batch["mask"]
    return err.sum(), {"num_tokens": batch["mask"].sum(), "abs_err": jnp.abs(err).sum()}


def toy_batch(rows: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    mask = (rng.random((rows, 5)) > 0.3).astype(np.float32)
    return {
        "x": jnp.asarray(rng.normal(size=(rows, 5, 3)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(rows, 5, 2)), jnp.float32),
        "mask": jnp.asarray(mask),
    }


def toy_params():
    return {"w": jnp.ones((3, 2)) * 0.1, "b": jnp.zeros((2,))}


@pytest.mark.parametrize("accumulation", [2, 4])
def test_accumulation_equals_full_batch(accumulation: int) -> None:
    optimizer = optax.adamw(1e-2)
    batch = toy_batch()
    state = init_state(toy_params(), optimizer, jax.random.PRNGKey(0))
    full = jax.jit(make_train_step(toy_loss, optimizer, accumulation=1))
    accum = jax.jit(make_train_step(toy_loss, optimizer, accumulation=accumulation))
    s1, m1 = full(state, batch)
    s2, m2 = accum(state, batch)
    # The sums that differ: a prediction (3 inputs), its squared error (2 outputs), the batch's 40 tokens;
    # the gradient norm adds the 8 parameters' squares. AdamW's first step is +-lr whatever those sums.
    terms = 3 + 2 + 8 * 5
    np.testing.assert_allclose(m1["loss"], m2["loss"], atol=summation_tolerance(m1["loss"], terms), rtol=0)
    norm_tolerance = summation_tolerance(m1["grad_norm"], terms + 8)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], atol=norm_tolerance, rtol=0)
    for a, b in zip(jax.tree_util.tree_leaves(s1.params), jax.tree_util.tree_leaves(s2.params)):
        np.testing.assert_allclose(a, b, atol=summation_tolerance(a, terms), rtol=0)
    assert float(m1["num_tokens"]) == float(batch["mask"].sum())


def test_loss_is_token_mean_and_matches_numpy() -> None:
    batch = toy_batch()
    params = toy_params()
    step = jax.jit(make_train_step(toy_loss, optax.sgd(0.0)))
    _, metrics = step(init_state(params, optax.sgd(0.0), jax.random.PRNGKey(0)), batch)
    x, y, mask = (np.asarray(batch[k]) for k in ("x", "y", "mask"))
    err = (((x @ np.asarray(params["w"])) - y) ** 2).sum(-1)
    expected = (err * mask).sum() / mask.sum()
    tolerance = summation_tolerance(expected, 3 + 2 + mask.size)  # numpy and XLA add in their own orders
    np.testing.assert_allclose(metrics["loss"], expected, atol=tolerance, rtol=0)
    np.testing.assert_allclose(metrics["abs_err"], expected, atol=tolerance, rtol=0)


@pytest.mark.parametrize("check_update_first", [False, True])
def test_nonfinite_update_is_skipped_and_counted(check_update_first: bool) -> None:
    optimizer = optax.adam(1e-2)
    state = init_state(toy_params(), optimizer, jax.random.PRNGKey(0))
    bad = toy_batch()
    bad["x"] = bad["x"].at[0, 0, 0].set(jnp.nan)
    step = jax.jit(make_train_step(toy_loss, optimizer, check_update_first=check_update_first))
    new_state, metrics = step(state, bad)
    assert int(metrics["nonfinite"]) == 1
    assert int(new_state.nonfinite_steps) == 1
    assert int(new_state.step) == 1
    np.testing.assert_array_equal(new_state.params["w"], state.params["w"])
    good_state, good_metrics = step(new_state, toy_batch())
    assert int(good_metrics["nonfinite"]) == 0
    assert not np.array_equal(good_state.params["w"], state.params["w"])


@pytest.mark.parametrize("check_update_first", [False, True])
def test_a_finite_gradient_with_an_overflowing_update_keeps_the_old_state(check_update_first: bool) -> None:
    optimizer = optax.adam(1e38)  # finite moments, an update whose norm overflows
    state = init_state(toy_params(), optimizer, jax.random.PRNGKey(0))
    step = jax.jit(make_train_step(toy_loss, optimizer, check_update_first=check_update_first))
    new_state, metrics = step(state, toy_batch())
    assert np.isfinite(float(metrics["grad_norm"])) and not np.isfinite(float(metrics["update_norm"]))
    assert int(metrics["nonfinite"]) == 1
    for new, old in zip(jax.tree_util.tree_leaves(new_state), jax.tree_util.tree_leaves(state), strict=True):
        if new.shape:  # every parameter and moment as it was (the step counter advanced)
            np.testing.assert_array_equal(new, old)


def test_checking_the_update_first_gives_the_same_bits_without_a_second_optimizer_state() -> None:
    """The same new state bit for bit as the skip by `where`; the compiled step's temporaries (CPU, as `halyard
    plan` compiles) within one leaf's gradient of a step without any skip, where the `where` holds new moments
    beside the old ones."""
    params = {"w": jnp.full((2048, 512), 0.01, jnp.bfloat16), "b": jnp.zeros((512,), jnp.bfloat16)}
    batch = {
        "x": jnp.asarray(np.random.default_rng(0).normal(size=(4, 2048)), jnp.float32),
        "y": jnp.zeros((4, 512), jnp.float32),
    }

    def loss(params, batch, key):
        pred = batch["x"].astype(jnp.bfloat16) @ params["w"] + params["b"]
        return ((pred - batch["y"]) ** 2).sum(), {"num_tokens": jnp.asarray(4.0)}

    optimizer = with_state_dtype(optax.adamw(1e-3), jnp.float32)
    state = init_state(params, optimizer, jax.random.PRNGKey(0))
    temporaries, results = {}, {}
    for name, options in {
        "no_skip": {"skip_nonfinite": False},
        "where": {},
        "first": {"check_update_first": True},
    }.items():
        step = jax.jit(make_train_step(loss, optimizer, **options), donate_argnums=0)
        compiled = step.lower(state, batch).compile(compiler_options=CPU_PLAN_OPTIONS)
        temporaries[name] = compiled.memory_analysis().temp_size_in_bytes
        results[name] = compiled(jax.tree_util.tree_map(jnp.copy, state), batch)
    for a, b in zip(*(jax.tree_util.tree_leaves(results[name]) for name in ("where", "first")), strict=True):
        np.testing.assert_array_equal(a, b)
    gradient, moments = 2048 * 512 * 2, 2 * 2048 * 512 * 4
    assert temporaries["first"] <= temporaries["no_skip"] + gradient + 4096, temporaries  # and a few scalars
    assert temporaries["where"] >= temporaries["first"] + moments / 2, temporaries


TINY_LLAMA = LlamaConfig(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    max_position=16,
)
TOKENS = {"tokens": jnp.asarray(np.random.default_rng(0).integers(0, 64, (4, 9)), jnp.int32)}


def _one_step(model_config: ModelConfig) -> tuple[TrainState, dict[str, jax.Array]]:
    optimizer = optax.adam(1e-2)
    model = model_config.init(jax.random.PRNGKey(0))
    step = jax.jit(make_train_step(lm_loss_fn(), optimizer))
    new_state, metrics = step(init_state(model, optimizer, jax.random.PRNGKey(1)), TOKENS)
    return new_state, metrics


def _floating_dtypes(tree: object) -> set:
    leaves = jax.tree_util.tree_leaves(tree)
    return {leaf.dtype for leaf in leaves if jnp.issubdtype(leaf.dtype, jnp.floating)}


def test_the_step_computes_in_the_models_compute_dtype_and_keeps_its_param_dtype() -> None:
    mixed = TINY_LLAMA.replace(param_dtype="float32", compute_dtype="bfloat16")
    new_state, metrics = _one_step(mixed)
    assert _floating_dtypes(new_state.params) == {jnp.dtype(jnp.float32)}
    # The loss is the bfloat16 model's (the model's own policy), not the float32 one's.
    loss_fn, key = jax.jit(lm_loss_fn()), jax.random.PRNGKey(0)
    bf16_sum, stats = loss_fn(mixed.init(key), TOKENS, key)
    f32_sum, _ = loss_fn(TINY_LLAMA.init(key), TOKENS, key)  # the same float32 weights, float32 compute
    tokens = float(stats["num_tokens"])
    np.testing.assert_allclose(float(metrics["loss"]), float(bf16_sum) / tokens, rtol=1e-6)
    assert abs(float(metrics["loss"]) - float(f32_sum) / tokens) > 1e-5


def test_bfloat16_parameters_stay_bfloat16_and_metrics_are_float32() -> None:
    new_state, metrics = _one_step(TINY_LLAMA.replace(param_dtype="bfloat16"))
    assert _floating_dtypes(new_state.params) == {jnp.dtype(jnp.bfloat16)}
    for name in ("loss", "grad_norm", "param_norm", "update_norm"):
        assert metrics[name].dtype == jnp.float32, name


def test_indivisible_batch_is_named() -> None:
    with pytest.raises(ValueError, match="trainer.accumulation=3"):
        split_microbatches({"x": jnp.zeros((8, 2))}, 3)


def _sophia_state(opt_state):
    from halyard.train.optim.sophia import SophiaHState

    found = [
        node
        for node in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, SophiaHState))
        if isinstance(node, SophiaHState)
    ]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_sophia_gets_the_token_mean_loss_of_the_first_microbatch(accumulation: int) -> None:
    from halyard.train.optim.config import SophiaHConfig
    from halyard.train.optim.schedule_config import ConstantScheduleConfig
    from halyard.train.optim.sophia import hutchinson_diagonal_hessian

    config = SophiaHConfig(learning_rate=1e-2, schedule=ConstantScheduleConfig(), max_grad_norm=None)
    optimizer = config.build(total_steps=4)
    batch, params = toy_batch(), toy_params()
    state = init_state(params, optimizer, jax.random.PRNGKey(0))
    step = jax.jit(make_train_step(toy_loss, optimizer, accumulation=accumulation))
    new_state, metrics = step(state, batch)
    assert int(metrics["nonfinite"]) == 0

    first = jax.tree_util.tree_map(lambda x: x[0], split_microbatches(batch, accumulation))
    first = batch if accumulation == 1 else first

    def mean_loss(p):
        total, stats = toy_loss(p, first, None)
        return total / stats["num_tokens"]

    _, estimate_key = jax.random.split(jax.random.key(config.seed))
    estimate = hutchinson_diagonal_hessian(mean_loss, params, estimate_key)
    hessian = _sophia_state(new_state.opt_state).hessian
    for name in ("w", "b"):
        expected = (1 - config.beta2) * estimate[name]
        # the loss's sums (3 inputs, 2 outputs, 40 tokens) in the forward, backward and Hessian-vector passes
        tolerance = summation_tolerance(expected, 3 * (3 + 2 + 8 * 5))
        np.testing.assert_allclose(hessian[name], expected, atol=tolerance, rtol=0)
