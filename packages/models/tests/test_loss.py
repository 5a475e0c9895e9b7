"""Blocked next-token loss: equal to full logits, to numpy and optax, and never materialising logits."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.models.loss import next_token_loss
from halyard.named import NamedArray, named

BATCH, POS, EMBED, VOCAB = 2, 6, 8, 37  # 37 is a multiple of no block size used below
# One token's loss: a logit's dot product, its soft-cap (tanh), the log-sum-exp's exp, sum and log, a blocked
# log-sum-exp's rescaling (an exp and a product) for each of up to VOCAB blocks, the z-loss's square; the
# batch's tokens summed. The backward pass goes through them again.
TOKEN_TERMS = EMBED + VOCAB * (FUNCTION_TERMS + 2) + 3 * FUNCTION_TERMS + 2
LOSS_TERMS = TOKEN_TERMS + BATCH * POS


def _problem(seed: int = 0) -> tuple[NamedArray, NamedArray, NamedArray, NamedArray]:
    rng = np.random.default_rng(seed)
    hidden = named(jnp.asarray(rng.normal(size=(BATCH, POS, EMBED)), jnp.float32), ("batch", "pos", "embed"))
    unembed = named(jnp.asarray(rng.normal(size=(VOCAB, EMBED)), jnp.float32), ("vocab", "embed"))
    labels = named(jnp.asarray(rng.integers(0, VOCAB, size=(BATCH, POS))), ("batch", "pos"))
    mask = named(jnp.asarray(rng.random(size=(BATCH, POS)) > 0.3), ("batch", "pos"))
    return hidden, unembed, labels, mask


@functools.cache
def _loss_and_grads(
    block_size: int | None, z_loss_weight: float, logit_scale: float, logit_softcap: float | None = None
) -> tuple:
    hidden, unembed, labels, mask = _problem()

    def loss(hidden: NamedArray, unembed: NamedArray) -> tuple:
        value, metrics = next_token_loss(
            hidden,
            unembed,
            labels,
            loss_mask=mask,
            block_size=block_size,
            z_loss_weight=z_loss_weight,
            logit_scale=logit_scale,
            logit_softcap=logit_softcap,
        )
        return value.array, metrics

    (value, metrics), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(hidden, unembed)
    return value, metrics, grads


# Logits here are about N(0, 8 * scale**2): a cap of 3 bends most of them.
SETTINGS = [(0.0, 1.0, None), (1e-2, 0.5, None), (1e-2, 2.0, 3.0)]


def _loss_scale(z_loss_weight: float, logit_scale: float, seed: int = 0) -> float:
    """The size of the addends of the loss of `_problem`: the largest logit (a log-sum-exp and the label's
    logit cancel down to the loss), and the z-loss's square doubles its relative error."""
    hidden, unembed, _, _ = _problem(seed)
    top = float(np.abs(np.asarray(hidden.array) @ np.asarray(unembed.array).T).max()) * logit_scale
    return top * (1 + 2 * z_loss_weight * top)


@pytest.mark.parametrize("block_size", [1, 8, 16, 2048])
@pytest.mark.parametrize(("z_loss_weight", "logit_scale", "logit_softcap"), SETTINGS)
def test_blocked_equals_full_logits_in_values_and_gradients(
    block_size: int, z_loss_weight: float, logit_scale: float, logit_softcap: float | None
) -> None:
    value, metrics, grads = _loss_and_grads(block_size, z_loss_weight, logit_scale, logit_softcap)
    full_value, full_metrics, full_grads = _loss_and_grads(None, z_loss_weight, logit_scale, logit_softcap)
    bound = summation_tolerance(_loss_scale(z_loss_weight, logit_scale), LOSS_TERMS)
    np.testing.assert_allclose(value, full_value, atol=bound, rtol=0)
    for name in ("cross_entropy", "z_loss", "num_tokens"):
        np.testing.assert_allclose(metrics[name].array, full_metrics[name].array, atol=bound, rtol=0)
    for got, want in zip(grads, full_grads):
        assert got.axes == want.axes
        bound = summation_tolerance(want.array, 2 * LOSS_TERMS)
        np.testing.assert_allclose(got.array, want.array, atol=bound, rtol=0)


def _numpy_loss(
    z_loss_weight: float, logit_scale: float, logit_softcap: float | None
) -> tuple[float, float, float]:
    hidden, unembed, labels, mask = (np.asarray(x.array, np.float64) for x in _problem())
    logits = np.einsum("bpe,ve->bpv", hidden, unembed) * logit_scale
    if logit_softcap is not None:  # as transformers' Gemma2ForCausalLM (final_logit_softcapping)
        logits = np.tanh(logits / logit_softcap) * logit_softcap
    top = logits.max(-1, keepdims=True)
    log_sum_exp = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
    label_logits = np.take_along_axis(logits, labels.astype(int)[..., None], -1)[..., 0]
    cross_entropy = (log_sum_exp - label_logits) * mask
    z_loss = log_sum_exp**2 * mask
    count = mask.sum()
    return (cross_entropy.sum() + z_loss_weight * z_loss.sum()) / count, cross_entropy.sum() / count, count


@pytest.mark.parametrize("block_size", [None, 8])
@pytest.mark.parametrize(("z_loss_weight", "logit_scale", "logit_softcap"), SETTINGS[1:])
def test_matches_numpy_cross_entropy_with_mask_and_z_loss(
    block_size: int | None, z_loss_weight: float, logit_scale: float, logit_softcap: float | None
) -> None:
    value, metrics, _ = _loss_and_grads(block_size, z_loss_weight, logit_scale, logit_softcap)
    expected, expected_cross_entropy, count = _numpy_loss(z_loss_weight, logit_scale, logit_softcap)
    bound = summation_tolerance(_loss_scale(z_loss_weight, logit_scale), LOSS_TERMS)
    np.testing.assert_allclose(value, expected, atol=bound, rtol=0)
    np.testing.assert_allclose(metrics["cross_entropy"].array, expected_cross_entropy, atol=bound, rtol=0)
    assert float(metrics["num_tokens"].array) == count


def test_matches_optax_per_token() -> None:
    hidden, unembed, labels, _ = _problem(seed=4)
    per_token, _ = next_token_loss(hidden, unembed, labels, block_size=8, reduction="none")
    logits = jnp.einsum("bpe,ve->bpv", hidden.array, unembed.array)
    expected = optax.softmax_cross_entropy_with_integer_labels(logits, labels.array)
    assert per_token.axis_names == ("batch", "pos")
    bound = summation_tolerance(_loss_scale(0.0, 1.0, seed=4), TOKEN_TERMS)
    np.testing.assert_allclose(per_token.array, expected, atol=bound, rtol=0)


def test_sum_reduction_float_weights_and_masked_out_of_range_labels() -> None:
    hidden, unembed, labels, _ = _problem(seed=5)
    weight_values = np.linspace(0.1, 1, BATCH * POS).reshape(BATCH, POS)
    weight_values[:, 0] = 0
    weights = named(jnp.asarray(weight_values, jnp.float32), ("batch", "pos"))
    # An ignore-index label (-100, as in Hugging Face) where the weight is zero must not matter.
    ignored = labels.at["pos", 0].set(-100)
    total, metrics = next_token_loss(
        hidden, unembed, ignored, loss_mask=weights, block_size=8, reduction="sum"
    )
    per_token, _ = next_token_loss(hidden, unembed, labels, block_size=None, reduction="none")
    expected = np.sum(np.asarray(per_token.array) * np.asarray(weights.array))
    bound = summation_tolerance(_loss_scale(0.0, 1.0, seed=5) * BATCH * POS, LOSS_TERMS)
    np.testing.assert_allclose(total.array, expected, atol=bound, rtol=0)
    count = np.sum(np.asarray(weights.array))
    np.testing.assert_allclose(
        metrics["num_tokens"].array, count, atol=summation_tolerance(count, BATCH * POS), rtol=0
    )


def test_batch_axes_beyond_batch_and_mask_broadcasting() -> None:
    hidden, unembed, labels, _ = _problem(seed=6)
    # Mask over pos only: broadcast over batch by name; unembed given as (embed, vocab).
    pos_mask = named(jnp.asarray([True, True, False, True, False, True]), ("pos",))
    value, _ = next_token_loss(
        hidden, unembed.rearrange("embed", "vocab"), labels, loss_mask=pos_mask, block_size=5
    )
    full_mask = named(jnp.broadcast_to(pos_mask.array, (BATCH, POS)), ("batch", "pos"))
    expected, _ = next_token_loss(hidden, unembed, labels, loss_mask=full_mask, block_size=None)
    bound = summation_tolerance(_loss_scale(0.0, 1.0, seed=6), LOSS_TERMS)
    np.testing.assert_allclose(value.array, expected.array, atol=bound, rtol=0)


def test_blocked_loss_never_builds_the_logits() -> None:
    tokens, embed, vocab, block = 256, 16, 32768, 1024
    hidden = named(jnp.zeros((tokens, embed), jnp.float32), ("pos", "embed"))
    unembed = named(jnp.zeros((vocab, embed), jnp.float32), ("vocab", "embed"))
    labels = named(jnp.zeros((tokens,), jnp.int32), ("pos",))

    def temp_bytes(block_size: int | None) -> int:
        def loss(hidden: NamedArray, unembed: NamedArray) -> jax.Array:
            return next_token_loss(hidden, unembed, labels, block_size=block_size)[0].array

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(hidden, unembed).compile()
        analysis = compiled.memory_analysis()
        assert analysis is not None
        return analysis.temp_size_in_bytes

    logits_bytes = tokens * vocab * 4
    assert temp_bytes(None) >= logits_bytes
    assert temp_bytes(block) < logits_bytes / 4


def test_full_logits_threshold_picks_the_full_path_only_for_small_logits() -> None:
    tokens, embed, vocab, block = 256, 16, 4096, 1024
    hidden = named(jnp.zeros((tokens, embed), jnp.float32), ("pos", "embed"))
    unembed = named(jnp.zeros((vocab, embed), jnp.float32), ("vocab", "embed"))
    labels = named(jnp.zeros((tokens,), jnp.int32), ("pos",))
    logits_bytes = tokens * vocab * 4

    def temp_bytes(full_logits_max_bytes: int) -> int:
        def loss(hidden: NamedArray, unembed: NamedArray) -> jax.Array:
            return next_token_loss(
                hidden, unembed, labels, block_size=block, full_logits_max_bytes=full_logits_max_bytes
            )[0].array

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(hidden, unembed).compile()
        analysis = compiled.memory_analysis()
        assert analysis is not None
        return analysis.temp_size_in_bytes

    assert temp_bytes(logits_bytes) >= logits_bytes  # fits: full logits
    assert temp_bytes(logits_bytes - 1) < logits_bytes / 2  # one byte more than allowed: blocks
    assert temp_bytes(0) < logits_bytes / 2


def test_bad_arguments_are_named() -> None:
    hidden, unembed, labels, _ = _problem()
    with pytest.raises(ValueError, match="reduction"):
        next_token_loss(hidden, unembed, labels, reduction="avg")
    with pytest.raises(ValueError, match="block_size"):
        next_token_loss(hidden, unembed, labels, block_size=0)
    with pytest.raises(ValueError, match="embed=8 but unembed has embed=4"):
        next_token_loss(hidden, unembed["embed", :4], labels)
    with pytest.raises(ValueError, match="labels have axes"):
        next_token_loss(hidden, unembed, labels["pos", :3])


def test_the_cap_changes_the_loss_and_gradients() -> None:
    """The blocked == full comparison would pass vacuously if the cap did nothing."""
    capped_value, _, capped_grads = _loss_and_grads(8, 1e-2, 2.0, 3.0)
    value, _, grads = _loss_and_grads(8, 1e-2, 2.0, None)
    assert abs(float(capped_value) - float(value)) > 1e-2
    for capped, uncapped in zip(capped_grads, grads, strict=True):
        assert np.max(np.abs(np.asarray(capped.array) - np.asarray(uncapped.array))) > 1e-3


@pytest.mark.parametrize("block_size", [None, 8])
def test_no_cap_adds_no_operation(block_size: int | None) -> None:
    """The uncapped program (forward and backward) holds no tanh; the capped one does."""
    hidden, unembed, labels, _ = _problem()

    def program(logit_softcap: float | None) -> str:
        def loss(hidden: NamedArray, unembed: NamedArray) -> jax.Array:
            value, _ = next_token_loss(
                hidden, unembed, labels, block_size=block_size, logit_softcap=logit_softcap
            )
            return value.array

        return str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(hidden, unembed))

    assert "tanh" not in program(None)
    assert "tanh" in program(30.0)


@pytest.mark.parametrize("cap", [0.0, -2.0, float("nan"), float("inf"), True])
def test_bad_caps_are_refused(cap: object) -> None:
    hidden, unembed, labels, _ = _problem()
    with pytest.raises(ValueError, match="next_token_loss: logit_softcap must be a positive finite number"):
        next_token_loss(hidden, unembed, labels, logit_softcap=cap)  # type: ignore[arg-type]


def test_bfloat16_weights_keep_their_blocked_gradient_in_bfloat16() -> None:
    """The backward scan stacks each vocabulary block's gradient in the weight's dtype: a bf16 unembedding's
    stacked gradients take bf16's bytes (the same values: blocks are disjoint, so this is the one rounding)."""
    tokens, embed, vocab, block = 64, 16, 4096, 1024
    labels = named(jnp.zeros((tokens,), jnp.int32), ("pos",))
    hidden = named(jnp.ones((tokens, embed), jnp.bfloat16), ("pos", "embed"))
    unembed = named(jnp.ones((vocab, embed), jnp.bfloat16), ("vocab", "embed"))

    def loss(hidden: NamedArray, unembed: NamedArray) -> jax.Array:
        return next_token_loss(hidden, unembed, labels, block_size=block)[0].array

    program = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(hidden, unembed)
    stacked = [
        var.aval
        for eqn in program.jaxpr.eqns
        if eqn.primitive.name == "scan"
        for var in eqn.outvars
        if var.aval.shape == (vocab // block, block, embed)
    ]
    assert stacked and all(aval.dtype == jnp.bfloat16 for aval in stacked), stacked
    grads = jax.grad(loss, argnums=(0, 1))(hidden, unembed)
    assert grads[1].dtype == jnp.bfloat16
