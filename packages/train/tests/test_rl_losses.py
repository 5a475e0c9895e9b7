"""GRPO's advantages and policy loss against TRL's `GRPOTrainer` on identical inputs, and their algebra.

Each case runs TRL's own `_generate_and_score_completions` and `_compute_loss` (trl_grpo_harness.py) and
Halyard's `group_advantages` and `policy_loss` (jitted) on the same float32 arrays: the advantages, the
loss (within 1e-6), its gradient with respect to the per-token log-probs (within 1e-5; torch autograd
against jax.grad) and every metric both log must agree, for each loss type, clip-higher, two-sided
clipping, the KL term with and without its importance weight, each importance-sampling mode and GSPO.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

pytest.importorskip("torch")
pytest.importorskip("trl")

from float_tolerance import FUNCTION_TERMS, summation_tolerance
from trl_grpo_harness import Case, Options, trl_grpo

from halyard.train.rl.losses import group_advantages, loss_normalizer, policy_loss

GROUPS, GROUP_SIZE, TOKENS = 4, 4, 7
# Sums whose order TRL's torch and XLA choose each their way: an advantage's mean and spread (over a group, or
# over the batch with batch scaling); the loss and its normaliser (every token of the batch, after them).
ADVANTAGE_TERMS = 2 * GROUPS * GROUP_SIZE
LOSS_TERMS = ADVANTAGE_TERMS + 2 * GROUPS * GROUP_SIZE * TOKENS


def make_case(seed: int, *, off_policy: bool = True, unscored: bool = False, drift: float = 0.25) -> Case:
    """Random log-probs near each other (ratios around 1 by ``drift``) and 0/0.5/1 rewards, one group equal;
    ``unscored``: a NaN reward in one group, only one scored in another."""
    rng = np.random.default_rng(seed)
    sequences = GROUPS * GROUP_SIZE
    lengths = rng.integers(1, TOKENS + 1, sequences)
    lengths[0] = TOKENS  # TRL pads to the longest completion: keep the width
    rewards = rng.integers(0, 3, (GROUPS, GROUP_SIZE)).astype(np.float32) / 2
    rewards[1] = 0.5
    if unscored:
        rewards[2, 1] = rewards[3, 1:] = np.nan
    old = rng.normal(-1.5, 0.6, (sequences, TOKENS)).astype(np.float32)

    def near(base: np.ndarray, scale: float) -> np.ndarray:
        return np.minimum(base + rng.normal(0.0, scale, base.shape), -1e-3).astype(np.float32)

    logps = near(old, drift)
    return Case(
        rewards=rewards,
        logps=logps,
        old_logps=old if off_policy else None,
        sampler_logps=near(old if off_policy else logps, 0.3),
        reference_logps=near(old, 0.3),
        lengths=lengths,
    )


def halyard_grpo(options: Options, case: Case, micro_batches: int = 1) -> dict:
    """Halyard's advantages, loss, gradient with respect to ``logps`` and metrics, jitted.

    With ``micro_batches`` > 1 the rows are split into that many equal micro-batches and accumulated
    as the train step does: the sum of their ``loss_sum`` over the sum of their ``normalizer``.
    """
    advantages, all_equal = group_advantages(jnp.asarray(case.rewards), scale=options.scale)  # type: ignore[arg-type]
    loss_fn = jax.jit(
        functools.partial(
            policy_loss,
            loss_type=options.loss_type,
            clip_low=options.clip_low,
            clip_high=options.clip_high,
            kl_beta=options.kl_beta,
            kl_importance_weighted=options.kl_importance_weighted,
            importance_sampling=options.importance_sampling,
            importance_cap=options.importance_cap,
            importance_floor=options.importance_floor,
            level=options.level,
            ratio_cap=options.ratio_cap,
            max_completion_length=options.max_completion_length,
        )
    )
    correction = options.importance_sampling != "none"

    def rows_of(array: np.ndarray | None, rows: slice) -> jax.Array | None:
        return None if array is None else jnp.asarray(array[rows])

    def loss(logps: jax.Array) -> tuple[jax.Array, dict]:
        size = logps.shape[0] // micro_batches
        parts = [
            loss_fn(
                logps[rows],
                rows_of(case.old_logps, rows),
                rows_of(case.sampler_logps if correction else None, rows),
                advantages.reshape(-1)[rows],
                jnp.asarray(case.mask[rows]),
                rows_of(case.reference_logps if options.kl_beta else None, rows),
            )
            for rows in (slice(start, start + size) for start in range(0, logps.shape[0], size))
        ]
        loss_sum = sum(part.loss_sum for part in parts)
        return loss_sum / sum(part.normalizer for part in parts), parts[-1].metrics

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(case.logps))
    return {
        "advantages": np.asarray(advantages).reshape(-1),
        "all_equal": np.asarray(all_equal),
        "loss": float(value),
        "grad": np.asarray(grad),
        "metrics": {name: float(v) for name, v in metrics.items()},
    }


CASES = {
    "grpo-on-policy": (Options(), {"off_policy": False}),
    "grpo": (Options(), {}),
    "bnpo": (Options(loss_type="bnpo"), {}),
    "dr_grpo": (Options(loss_type="dr_grpo", scale="none"), {}),
    "dapo-clip-higher": (Options(loss_type="dapo", clip_high=0.28), {}),
    "grpo-batch-scale": (Options(scale="batch"), {}),
    "two-sided-clipping": (Options(ratio_cap=1.15), {}),
    "kl": (Options(kl_beta=0.04), {}),
    "kl-unweighted": (Options(kl_beta=0.04, kl_importance_weighted=False), {}),
    "kl-on-policy": (Options(kl_beta=0.1), {"off_policy": False}),
    "is-token": (Options(importance_sampling="token", importance_cap=1.3), {}),
    "is-token-on-policy": (Options(importance_sampling="token", importance_cap=1.3), {"off_policy": False}),
    "is-sequence": (Options(importance_sampling="sequence", importance_cap=2.0, importance_floor=0.5), {}),
    "is-token-mask": (
        Options(importance_sampling="token_mask", importance_cap=1.4, importance_floor=0.7),
        {},
    ),
    "is-sequence-mask": (
        Options(loss_type="dapo", importance_sampling="sequence_mask", importance_cap=1.5),
        {},
    ),
    "gspo": (Options(level="sequence", clip_low=0.03, clip_high=0.04), {}),
    "gspo-kl-is": (
        Options(
            level="sequence", clip_low=0.03, clip_high=0.04, kl_beta=0.04, importance_sampling="sequence"
        ),
        {},
    ),
    "unscored": (Options(), {"unscored": True}),
    "unscored-dr_grpo": (Options(loss_type="dr_grpo", scale="none"), {"unscored": True}),
    "unscored-batch-scale": (Options(scale="batch"), {"unscored": True}),
}

# Logged by TRL from what Halyard's loss does not see: the rewards (the trainer logs those) and the entropy.
NOT_FROM_THE_LOSS = {"reward", "reward_std", "rewards/reward/mean", "rewards/reward/std", "entropy"}


def case_named(name: str) -> tuple[Options, Case]:
    options, case_options = CASES[name]
    return options, make_case(seed=sorted(CASES).index(name), **case_options)


@pytest.mark.parametrize("name", list(CASES))
def test_loss_and_gradient_equal_trl(name: str) -> None:
    options, case = case_named(name)
    expected, ours = trl_grpo(options, case), halyard_grpo(options, case)

    # bounds scaled by the advantages, the addends' size: the loss sums terms of both signs
    advantage_tolerance = summation_tolerance(expected["advantages"], ADVANTAGE_TERMS)
    loss_tolerance = summation_tolerance(expected["advantages"], LOSS_TERMS)
    np.testing.assert_allclose(ours["advantages"], expected["advantages"], atol=advantage_tolerance, rtol=0)
    assert np.abs(expected["grad"]).max() > 1e-3  # a real gradient is compared
    np.testing.assert_allclose(ours["loss"], expected["loss"], atol=loss_tolerance, rtol=0)
    grad_tolerance = summation_tolerance(expected["grad"], LOSS_TERMS)
    np.testing.assert_allclose(ours["grad"], expected["grad"], atol=grad_tolerance, rtol=0)

    trl_metrics = dict(expected["metrics"])
    zero_std = trl_metrics.pop("frac_reward_zero_std")
    if options.scale != "batch":  # with batch scaling TRL logs whether the batch's std is 0
        # TRL does not count a group with fewer than two scored rewards; Halyard flags it (nothing to learn).
        scored = np.sum(~np.isnan(case.rewards), axis=1)
        share = np.mean(ours["all_equal"] & (scored >= 2))  # TRL's in float32: one rounding of a share
        assert zero_std == pytest.approx(share, rel=0, abs=summation_tolerance(share, 1)) and zero_std > 0
        np.testing.assert_array_equal(ours["all_equal"][scored < 2], True)
    shared = set(trl_metrics) - NOT_FROM_THE_LOSS
    assert shared <= set(ours["metrics"]), sorted(shared - set(ours["metrics"]))
    for metric in sorted(shared):  # means over the batch's tokens of what the loss sums
        bound = summation_tolerance(trl_metrics[metric], LOSS_TERMS)
        np.testing.assert_allclose(
            ours["metrics"][metric], trl_metrics[metric], atol=bound, rtol=0, err_msg=metric
        )


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo-clip-higher", "gspo-kl-is", "unscored"])
def test_accumulated_micro_batches_equal_trl(name: str) -> None:
    """Two micro-batches of a generation batch, accumulated the train step's way, give TRL's loss and
    gradient over the same two gradient-accumulation steps (``bnpo`` is left out: accumulated so it is
    ``dapo``, where TRL averages the micro-batches' means)."""
    options, case = case_named(name)
    expected, ours = trl_grpo(options, case, micro_batches=2), halyard_grpo(options, case, micro_batches=2)
    loss_tolerance = summation_tolerance(expected["advantages"], LOSS_TERMS)
    grad_tolerance = summation_tolerance(expected["grad"], LOSS_TERMS)
    np.testing.assert_allclose(ours["loss"], expected["loss"], atol=loss_tolerance, rtol=0)
    np.testing.assert_allclose(ours["grad"], expected["grad"], atol=grad_tolerance, rtol=0)
    whole = halyard_grpo(options, case)
    np.testing.assert_allclose(ours["loss"], whole["loss"], atol=loss_tolerance, rtol=0)
    np.testing.assert_allclose(ours["grad"], whole["grad"], atol=grad_tolerance, rtol=0)
    if options.loss_type == "dapo":  # each micro-batch's loss over the generation batch's token count
        half = GROUPS * GROUP_SIZE // 2
        parts = [
            policy_loss(
                jnp.asarray(case.logps[rows]),
                jnp.asarray(case.old_logps[rows]),  # type: ignore[index]
                None,
                jnp.asarray(whole["advantages"][rows]),
                jnp.asarray(case.mask[rows]),
                loss_type="dapo",
                clip_high=options.clip_high,
                total_tokens=case.mask.sum(),
            ).loss
            for rows in (slice(0, half), slice(half, None))
        ]
        np.testing.assert_allclose(sum(parts), whole["loss"], atol=loss_tolerance, rtol=0)


def test_the_cases_clip_and_correct() -> None:
    """Each off-policy case clips some ratios, two-sided clipping's cap and the sampler weights act."""
    results = {}
    for name in CASES:
        options, case = case_named(name)
        results[name] = halyard_grpo(options, case)
        metrics = results[name]["metrics"]
        assert (metrics["clip_ratio/region_mean"] > 0) == (case.old_logps is not None), name
        if options.importance_sampling != "none":
            ratio = "sampling/importance_sampling_ratio"
            assert metrics[f"{ratio}/min"] < 1 < metrics[f"{ratio}/max"] <= options.importance_cap, name  # type: ignore[operator]
            assert (metrics[f"{ratio}/min"] == 0) == options.importance_sampling.endswith("mask"), name
    options, case = case_named("two-sided-clipping")
    uncapped = halyard_grpo(dataclasses.replace(options, ratio_cap=None), case)
    assert abs(uncapped["loss"] - results["two-sided-clipping"]["loss"]) > 1e-3


def test_options_are_checked() -> None:
    case = make_case(0)
    arrays = (jnp.asarray(case.logps), None, None, jnp.zeros(GROUPS * GROUP_SIZE), jnp.asarray(case.mask))
    with pytest.raises(ValueError, match="not one of grpo, bnpo, dr_grpo, dapo"):
        policy_loss(*arrays, loss_type="ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss(*arrays, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="needs reference_logps"):
        policy_loss(*arrays, kl_beta=0.1)
    with pytest.raises(ValueError, match="needs sampler_logps"):
        policy_loss(*arrays, importance_sampling="token")
    with pytest.raises(ValueError, match="token, sequence"):
        policy_loss(*arrays, level="group")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group, batch, none"):
        group_advantages(jnp.zeros((2, 2)), scale="std")  # type: ignore[arg-type]


rewards_arrays = hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 5), st.integers(2, 6)),
    elements=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]),
)


@settings(max_examples=40, deadline=None)
@given(rewards=rewards_arrays, shift=st.floats(-3, 3))
def test_advantages_are_centred_and_shift_invariant(rewards: np.ndarray, shift: float) -> None:
    for scale in ("group", "none"):
        advantages, all_equal = group_advantages(jnp.asarray(rewards), scale=scale)  # type: ignore[arg-type]
        np.testing.assert_allclose(np.sum(advantages, axis=1), 0.0, atol=1e-4)
        shifted, _ = group_advantages(jnp.asarray(rewards + np.float32(shift)), scale=scale)  # type: ignore[arg-type]
        np.testing.assert_allclose(shifted, advantages, atol=1e-4)
        equal = (rewards == rewards[:, :1]).all(axis=1)
        np.testing.assert_array_equal(all_equal, equal)
        assert np.all(np.asarray(advantages)[equal] == 0)
    # Group scaling: unit (unbiased) standard deviation in each group with different rewards.
    advantages, all_equal = group_advantages(jnp.asarray(rewards), scale="group")
    spread = np.std(np.asarray(advantages), axis=1, ddof=1)[~np.asarray(all_equal)]
    np.testing.assert_allclose(spread, 1.0, rtol=1e-3)


def test_equal_rewards_float32_cannot_hold_give_zero_advantages() -> None:
    """Three rewards of 2.9: their float32 mean is a rounding off 2.9, and TRL's arithmetic gives them
    advantages of -0.0024 and misses the group in its zero-std share; Halyard's are 0, the group flagged."""
    torch = pytest.importorskip("torch")
    from trl.trainer.utils import nanstd

    rewards = np.asarray([[2.9, 2.9, 2.9], [0.1, 0.2, 0.3]], np.float32)
    grouped = torch.tensor(rewards)
    trl_std = nanstd(grouped, dim=1, keepdim=True)
    trl_advantages = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)) / (trl_std + 1e-4)
    assert abs(float(trl_advantages[0, 0])) > 1e-3 and not torch.isclose(trl_std[0], torch.zeros(1))
    advantages, all_equal = group_advantages(jnp.asarray(rewards))
    np.testing.assert_array_equal(all_equal, [True, False])
    np.testing.assert_array_equal(advantages[0], 0.0)
    # a group's mean and spread (3 rewards each) and a square root, on rewards 3 times their spread
    bound = summation_tolerance(rewards[1] / np.std(rewards[1], ddof=1), 2 * 3 + FUNCTION_TERMS)
    np.testing.assert_allclose(advantages[1], trl_advantages[1].numpy(), atol=bound, rtol=0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), loss_type=st.sampled_from(["grpo", "bnpo", "dr_grpo", "dapo"]))
def test_on_policy_gradient_is_the_policy_gradient(seed: int, loss_type: str) -> None:
    """At ``pi_theta = pi_old`` no ratio is clipped and the gradient is ``-A_i / normaliser`` on each token
    (``grpo``: ``-A_i / (len_i * sequences)``): REINFORCE with the group baseline."""
    case = make_case(seed, off_policy=False)
    rng = np.random.default_rng(seed)
    advantages = jnp.asarray(rng.normal(size=GROUPS * GROUP_SIZE).astype(np.float32))
    mask = jnp.asarray(case.mask)

    def loss(logps: jax.Array) -> jax.Array:
        return policy_loss(
            logps,
            None,
            None,
            advantages,
            mask,
            loss_type=loss_type,
            max_completion_length=TOKENS,  # type: ignore[arg-type]
        ).loss

    value, grad = jax.value_and_grad(loss)(jnp.asarray(case.logps))
    normalizer = loss_normalizer(mask, loss_type=loss_type, max_completion_length=TOKENS)  # type: ignore[arg-type]
    per_token = -advantages[:, None] * mask
    if loss_type == "grpo":
        per_token = per_token / jnp.sum(mask, axis=1, keepdims=True)
    # a token's gradient is a product and two quotients, rounded in another order; the loss sums the tokens
    np.testing.assert_allclose(
        grad, per_token / normalizer, atol=summation_tolerance(per_token / normalizer, 4), rtol=0
    )
    expected = jnp.sum(per_token) / normalizer
    bound = summation_tolerance(
        np.abs(per_token).sum() / normalizer, per_token.size + 4
    )  # terms of both signs
    np.testing.assert_allclose(value, expected, atol=bound, rtol=0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), level=st.sampled_from(["token", "sequence"]))
def test_padding_does_not_matter(seed: int, level: str) -> None:
    """Values under the mask (and rows with no tokens) change neither the loss nor the metrics, and get no
    gradient."""
    case = dataclasses.replace(make_case(seed), lengths=make_case(seed).lengths.copy())
    case.lengths[-1] = 0
    mask = jnp.asarray(case.mask)
    noise = np.random.default_rng(seed).normal(0.0, 5.0, case.logps.shape).astype(np.float32) * (
        1 - case.mask
    )
    advantages = jnp.asarray(np.linspace(-1, 1, GROUPS * GROUP_SIZE, dtype=np.float32))
    options = {"level": level, "kl_beta": 0.05, "importance_sampling": "sequence", "loss_type": "grpo"}

    def run(garbage: np.ndarray) -> tuple:
        def loss(logps: jax.Array) -> tuple:
            out = policy_loss(
                logps,
                jnp.asarray(case.old_logps + garbage),  # type: ignore[operator]
                jnp.asarray(case.sampler_logps + garbage),
                advantages,
                mask,
                jnp.asarray(case.reference_logps + garbage),
                **options,  # type: ignore[arg-type]
            )
            return out.loss, out.metrics

        return jax.value_and_grad(loss, has_aux=True)(jnp.asarray(case.logps + garbage))

    (clean, clean_metrics), clean_grad = run(np.zeros_like(noise))
    (noisy, noisy_metrics), noisy_grad = run(noise)
    # bitwise: the masked values are multiplied by 0 or replaced before any sum, the same program otherwise
    np.testing.assert_array_equal(noisy, clean)
    np.testing.assert_array_equal(noisy_grad, clean_grad)
    assert np.all(np.asarray(noisy_grad)[np.asarray(case.mask) == 0] == 0)
    for name, value in clean_metrics.items():
        np.testing.assert_array_equal(noisy_metrics[name], value, err_msg=name)
