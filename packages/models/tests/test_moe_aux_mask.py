"""The MoE router losses are means over real tokens: padding and loss-masked positions do not count.

References: the router losses recomputed in plain jnp from each layer's router logits of the unpadded rows
only, and transformers' ``load_balancing_loss_func`` with an ``attention_mask``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from float_tolerance import FUNCTION_TERMS, decoder_terms, summation_tolerance
from hf_weights import halyard_from_torch
from tiny import random_tokens, tiny

from halyard.models import LmBatch, init_model
from halyard.models.attention import AttentionMask
from halyard.models.layers.moe import MoeMLP
from halyard.models.model import default_positions
from halyard.named import Axis, named

NUM_EXPERTS, TOP_K = 4, 2
EPS = float(np.finfo(np.float32).eps)


def router_loss_tolerance(config, value: float, length: int, tokens: int) -> float:  # type: ignore[no-untyped-def]
    """Two programs' (or torch's) router losses: the forward up to the last layer's router logits, their
    softmax (an exp and the sum over the experts), the means over the ``tokens`` counted, the z-loss's log
    and square."""
    terms = decoder_terms(config, length) + NUM_EXPERTS + tokens + 3 * FUNCTION_TERMS
    return summation_tolerance(value, terms)


@jax.jit
def router_logits_per_layer(model, tokens) -> list[jax.Array]:
    """Every layer's router logits ``[tokens, experts]``, running the blocks one by one (no token mask)."""
    mask = model.complete_mask(AttentionMask(causal=True))
    positions = default_positions(tokens)
    x = model.embed(tokens)
    logits = []
    for index in range(model.config.num_layers):
        block = model.layers.layer(index)
        attended, _ = block.attention(block.attention_norm(x), mask, positions, model.config.rope)
        routed_input = block.mlp_norm(x + attended)
        logits.append(block.mlp.route(routed_input)[0])
        x, _ = block(x, mask, positions, kind=model.config.layer_kinds()[index])
    return logits


def reference_router_losses(logits: list[jax.Array]) -> tuple[float, float]:
    """Load balancing (``E * sum_e f_e P_e`` over all layers' tokens) and z-loss, in plain jnp."""
    stacked = jnp.concatenate([jnp.asarray(layer) for layer in logits])  # [layers * tokens, experts]
    probabilities = jax.nn.softmax(stacked, axis=-1)
    chosen = jnp.argsort(-probabilities, axis=-1, stable=True)[:, :TOP_K]
    counts = jnp.sum(jax.nn.one_hot(chosen, NUM_EXPERTS), axis=(0, 1))
    tokens = stacked.shape[0]
    balance = NUM_EXPERTS * jnp.sum((counts / tokens) * jnp.mean(probabilities, axis=0))
    z_loss = jnp.mean(jnp.square(jax.nn.logsumexp(stacked, axis=-1)))
    return float(balance), float(z_loss)


def test_half_the_batch_padded_gives_the_losses_of_the_unpadded_rows() -> None:
    config = tiny("mixtral", num_experts=NUM_EXPERTS, num_experts_per_token=TOP_K, router_z_loss_coef=0.01)
    model = init_model(config, jax.random.key(0))
    real = np.asarray(random_tokens(2, 9, seed=1).array)
    windows = np.concatenate([real, np.zeros_like(real)])  # rows 2 and 3: padding (id 0)
    loss_mask = np.concatenate([np.ones_like(real), np.zeros_like(real)])
    loss = jax.jit(lambda m, b: m.loss(b))
    _, padded = loss(model, LmBatch.from_tokens(windows, loss_mask=loss_mask))

    # The loss mask of a row is read at the label: the inputs counted are positions 0..7 of rows 0 and 1.
    inputs = named(jnp.asarray(real[:, :-1], jnp.int32), ("batch", "pos"))
    expected_balance, expected_z = reference_router_losses(router_logits_per_layer(model, inputs))
    balance_bound = router_loss_tolerance(config, expected_balance, 8, 16)
    z_bound = router_loss_tolerance(config, expected_z, 8, 16)
    np.testing.assert_allclose(
        float(padded["load_balancing_loss"]), expected_balance, atol=balance_bound, rtol=0
    )
    np.testing.assert_allclose(float(padded["router_z_loss"]), expected_z, atol=z_bound, rtol=0)
    _, alone = loss(model, LmBatch.from_tokens(real))
    np.testing.assert_allclose(
        float(padded["load_balancing_loss"]), float(alone["load_balancing_loss"]), atol=balance_bound, rtol=0
    )
    np.testing.assert_allclose(
        float(padded["router_z_loss"]), float(alone["router_z_loss"]), atol=z_bound, rtol=0
    )

    # Counting the padding rows (the former behaviour) gives other values: the test can tell them apart.
    all_inputs = named(jnp.asarray(windows[:, :-1], jnp.int32), ("batch", "pos"))
    unmasked_balance, unmasked_z = reference_router_losses(router_logits_per_layer(model, all_inputs))
    assert abs(unmasked_balance - expected_balance) > 1e-3 and abs(unmasked_z - expected_z) > 1e-3
    # The cross-entropy and the forward pass are untouched by the mask.
    # two programs (other batch shapes): the forward, the vocabulary's log-sum-exp and the 16 tokens' mean
    terms = decoder_terms(config, 8) + config.vocab_size + 16 + 2 * FUNCTION_TERMS
    bound = summation_tolerance(float(alone["cross_entropy"]), terms)
    np.testing.assert_allclose(
        float(padded["cross_entropy"]), float(alone["cross_entropy"]), atol=bound, rtol=0
    )


def test_right_padding_matches_transformers_load_balancing_with_an_attention_mask() -> None:
    hf_config = transformers.MixtralConfig(
        vocab_size=97, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K,
        initializer_range=0.2, max_position_embeddings=64,
    )  # fmt: skip
    hf_config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf_model = transformers.MixtralForCausalLM(hf_config).eval().float()
    model = halyard_from_torch(hf_model)
    ids = np.random.default_rng(0).integers(1, 97, size=(3, 12))
    attention_mask = np.ones((3, 12), np.int64)
    attention_mask[1, 7:] = 0
    attention_mask[2, 3:] = 0
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(attention_mask),
            output_router_logits=True,
        )
        expected = transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func(
            out.router_logits, NUM_EXPERTS, TOP_K, torch.tensor(attention_mask)
        ).item()
    # The loader's loss mask is read at the label (one to the right): shift it so input i counts iff
    # attention_mask[i] is 1.
    windows = np.concatenate([ids, ids[:, :1]], axis=1)
    loss_mask = np.concatenate([np.ones((3, 1), np.int64), attention_mask], axis=1)
    _, metrics = jax.jit(lambda m, b: m.loss(b))(model, LmBatch.from_tokens(windows, loss_mask=loss_mask))
    bound = router_loss_tolerance(model.model_config, expected, 12, int(attention_mask.sum()))
    np.testing.assert_allclose(float(metrics["load_balancing_loss"]), expected, atol=bound, rtol=0)


def test_the_token_mask_changes_only_the_statistics() -> None:
    Embed, Mlp, Experts = Axis("embed", 16), Axis("mlp", 24), Axis("experts", NUM_EXPERTS)
    layer = MoeMLP.init(
        Embed, Mlp, Experts, top_k=TOP_K, key=jax.random.key(0), act="silu", init_std=0.3, dtype=jnp.float32
    )
    x = named(jax.random.normal(jax.random.key(1), (2, 5, 16)), ("batch", "pos", "embed"))
    mask = np.zeros((2, 5), np.float32)
    mask[0, :3] = 1.0
    y_all, stats_all = layer(x)
    y_masked, stats = layer(x, named(jnp.asarray(mask), ("batch", "pos")))
    np.testing.assert_array_equal(np.asarray(y_all.array), np.asarray(y_masked.array))
    assert float(stats.tokens) == 3.0 and float(stats_all.tokens) == 10.0
    assert float(jnp.sum(stats.assignments)) == 3.0 * TOP_K
    first = x[{"batch": 0}]["pos", 0:3]
    _, stats_first = layer(first)
    # counts of whole tokens: exact; the rest from router logits of another shape's program
    np.testing.assert_array_equal(np.asarray(stats.assignments), np.asarray(stats_first.assignments))
    probabilities, z_loss = router_stat_bounds(layer, first, np.asarray(stats_first.z_loss))
    np.testing.assert_allclose(
        np.asarray(stats.probabilities), np.asarray(stats_first.probabilities), rtol=probabilities, atol=0
    )
    np.testing.assert_allclose(np.asarray(stats.z_loss), np.asarray(stats_first.z_loss), atol=z_loss, rtol=0)
    # A mask over the axes in another order is matched by name: the same mask, the same operations.
    transposed = named(jnp.asarray(mask.T), ("pos", "batch"))
    np.testing.assert_array_equal(
        np.asarray(layer(x, transposed)[1].probabilities), np.asarray(stats.probabilities)
    )


def router_stat_bounds(layer: MoeMLP, x, z_loss: np.ndarray) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """How far two programs' router statistics of the tokens ``x`` may differ: ``(relative bound of the summed
    probabilities, absolute bound of the summed z-loss)``.

    A router logit is a dot product over the width: it differs by ``width`` roundings at its addends' size
    ``A`` (the largest ``sum |x| |w|``). A softmax probability errs, relatively, by twice its logits' errors
    (with the subtraction of the max, at up to 2A) and its exp, k-sum and division; summed over the tokens
    (positive: relative again). A token's logsumexp (at most A + log k) errs by the logits' error and its own
    exp, log and sums; its square by twice that times its size, summed over the tokens, and the sum's own.
    """
    router = np.abs(np.asarray(layer.router.weight.rearrange("embed", "experts").array, np.float64))
    assert x.axes[-1].name == "embed", x.axes
    values = np.abs(np.asarray(x.array, np.float64)).reshape(-1, router.shape[0])
    addends = float(np.max(values @ router))
    width, tokens = router.shape[0], values.shape[0]
    logit = summation_tolerance(addends, width + 2)
    probabilities = 2 * logit + EPS * (FUNCTION_TERMS + NUM_EXPERTS + 2 + tokens)
    size = addends + np.log(NUM_EXPERTS)
    logsumexp = logit + summation_tolerance(size, 2 * FUNCTION_TERMS + NUM_EXPERTS + 2)
    return probabilities, 2 * tokens * size * logsumexp + summation_tolerance(z_loss, tokens + 2)


def test_an_all_masked_batch_has_zero_router_losses_and_a_wrong_mask_is_refused() -> None:
    config = tiny("mixtral", num_experts=NUM_EXPERTS, num_experts_per_token=TOP_K)
    model = init_model(config, jax.random.key(0))
    windows = np.asarray(random_tokens(2, 6).array)
    _, metrics = jax.jit(lambda m, b: m.loss(b))(
        model, LmBatch.from_tokens(windows, loss_mask=np.zeros_like(windows))
    )
    assert float(metrics["load_balancing_loss"]) == 0.0 and float(metrics["router_z_loss"]) == 0.0
    layer = model.layers.layer(0).mlp
    x = named(jnp.ones((2, 5, config.hidden_size)), ("batch", "pos", "embed"))
    with pytest.raises(ValueError, match="token_mask has axes"):
        layer(x, named(jnp.ones((2, 4)), ("batch", "pos")))
