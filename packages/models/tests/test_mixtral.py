"""Mixtral: logits and the load-balancing loss against transformers, dropless dispatch against a dense
per-expert reference, deterministic routing, and the auxiliary losses in the training loss."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from float_tolerance import FUNCTION_TERMS, referee_terms, summation_tolerance
from hf_weights import halyard_from_torch
from tiny import random_tokens, tiny

from halyard.models import LmBatch, init_model
from halyard.models.attention import AttentionMask
from halyard.models.layers.moe import MoeMLP
from halyard.named import Axis, named


def _hf_mixtral() -> tuple[transformers.MixtralForCausalLM, transformers.MixtralConfig]:
    config = transformers.MixtralConfig(
        vocab_size=97, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, initializer_range=0.2,
        max_position_embeddings=64, router_aux_loss_coef=0.01,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(config).eval().float(), config


def test_mixtral_logits_and_load_balancing_loss_match_transformers() -> None:
    hf_model, _ = _hf_mixtral()
    model = halyard_from_torch(hf_model)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 97, size=(2, 12))
    attention_mask = np.ones((2, 12), np.int64)
    attention_mask[1, 8:] = 0
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention_mask))
    tokens = named(jnp.asarray(ids, jnp.int32), ("batch", "pos"))
    mask = AttentionMask(
        causal=True, key_valid=named(jnp.asarray(attention_mask, bool), ("batch", "key_pos"))
    )
    logits = np.asarray(
        jax.jit(lambda m, t, k: m(t, mask=k))(model, tokens, mask).unwrap("batch", "pos", "vocab")
    )
    valid = attention_mask.astype(bool)
    # two implementations: each its own forward pass and rotary angles (referee_terms), at the logits' size
    terms = referee_terms(model.model_config, 12)
    bound = summation_tolerance(out.logits.numpy()[valid], terms)
    np.testing.assert_allclose(logits[valid], out.logits.numpy()[valid], atol=bound, rtol=0)

    # the load-balancing loss over every token of the unpadded batch (Halyard routes every token)
    with torch.no_grad():
        full = hf_model(input_ids=torch.tensor(ids), output_router_logits=True)
        expected_balance = transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func(
            full.router_logits, 4, 2, None
        ).item()
    windows = np.concatenate([ids, ids[:, :1]], axis=1)
    _, metrics = jax.jit(lambda m, b: m.loss(b))(model, LmBatch.from_tokens(windows))
    # the router logits of both forwards, their softmax (an exp, the 4 experts' sum), the means over 24 tokens
    bound = summation_tolerance(expected_balance, terms + 4 + 24 + FUNCTION_TERMS)
    np.testing.assert_allclose(float(metrics["load_balancing_loss"]), expected_balance, atol=bound, rtol=0)


def _dense_reference(layer: MoeMLP, x: np.ndarray) -> np.ndarray:
    """Every expert on every token, weighted by the (renormalised) top-k router weights, zero elsewhere."""
    router = np.asarray(layer.router.weight.unwrap("embed", "experts"))
    logits = x @ router
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    chosen = np.argsort(-probabilities, axis=-1, kind="stable")[:, : layer.top_k]
    out = np.zeros_like(x)
    gate, up = (
        np.asarray(layer.gate.unwrap("experts", "embed", "mlp")),
        np.asarray(layer.up.unwrap("experts", "embed", "mlp")),
    )
    down = np.asarray(layer.down.unwrap("experts", "mlp", "embed"))
    for token in range(x.shape[0]):
        weights = probabilities[token, chosen[token]]
        weights = weights / weights.sum()
        for expert, weight in zip(chosen[token], weights):
            g = x[token] @ gate[expert]
            hidden = g / (1 + np.exp(-g)) * (x[token] @ up[expert])
            out[token] += weight * (hidden @ down[expert])
    return out


def test_dropless_dispatch_equals_dense_per_expert_reference_values_and_gradients() -> None:
    Embed, Mlp, Experts = Axis("embed", 8), Axis("mlp", 12), Axis("experts", 5)
    layer = MoeMLP.init(
        Embed, Mlp, Experts, top_k=2, key=jax.random.key(0), act="silu", init_std=0.5, dtype=jnp.float32
    )
    x = np.random.default_rng(1).normal(size=(3, 7, 8)).astype(np.float32)
    y, stats = layer(named(jnp.asarray(x), ("batch", "pos", "embed")))
    expected = _dense_reference(layer, x.reshape(-1, 8)).reshape(3, 7, 8)
    # per token: the router (8) and its softmax (5 experts, an exp), an expert's MLP (8, silu, 12), the
    # 2 experts combined
    terms = 8 + 5 + FUNCTION_TERMS + 8 + FUNCTION_TERMS + 12 + 2
    np.testing.assert_allclose(
        np.asarray(y.unwrap("batch", "pos", "embed")),
        expected,
        atol=summation_tolerance(expected, terms),
        rtol=0,
    )
    assert float(stats.assignments.sum()) == 3 * 7 * 2  # dropless: every (token, slot) is computed

    # gradients w.r.t. the expert weights, against autodiff through a dense formulation
    def dense_loss(gate):
        moved = eqx_replace_gate(layer, gate)
        return dense_jax(moved, jnp.asarray(x.reshape(-1, 8))).sum()

    def sparse_loss(gate):
        moved = eqx_replace_gate(layer, gate)
        return moved(named(jnp.asarray(x), ("batch", "pos", "embed")))[0].array.sum()

    gate = layer.gate.array
    dense_grad = jax.grad(dense_loss)(gate)
    bound = summation_tolerance(dense_grad, 2 * terms + 3 * 7)  # forward, backward, summed over the 21 tokens
    np.testing.assert_allclose(jax.grad(sparse_loss)(gate), dense_grad, atol=bound, rtol=0)


def eqx_replace_gate(layer: MoeMLP, gate: jax.Array) -> MoeMLP:
    return eqx.tree_at(lambda m: m.gate, layer, type(layer.gate)(gate, layer.gate.axes))


def dense_jax(layer: MoeMLP, x: jax.Array) -> jax.Array:
    """A plain-JAX dense formulation: all experts on all tokens, combined with a one-hot weight matrix."""
    logits = x @ layer.router.weight.unwrap("embed", "experts")
    probabilities = jax.nn.softmax(logits, axis=-1)
    values, chosen = jax.lax.top_k(probabilities, layer.top_k)
    values = values / values.sum(-1, keepdims=True)
    combine = jnp.sum(
        jax.nn.one_hot(chosen, probabilities.shape[-1]) * values[..., None], axis=1
    )  # [tokens, experts]
    gate = jnp.einsum("td,edm->tem", x, layer.gate.unwrap("experts", "embed", "mlp"))
    up = jnp.einsum("td,edm->tem", x, layer.up.unwrap("experts", "embed", "mlp"))
    out = jnp.einsum("tem,emd->ted", jax.nn.silu(gate) * up, layer.down.unwrap("experts", "mlp", "embed"))
    return jnp.einsum("ted,te->td", out, combine)


def test_routing_is_deterministic_and_ties_go_to_the_lower_expert() -> None:
    Embed, Mlp, Experts = Axis("embed", 4), Axis("mlp", 6), Axis("experts", 4)
    layer = MoeMLP.init(
        Embed, Mlp, Experts, top_k=2, key=jax.random.key(0), act="silu", init_std=0.5, dtype=jnp.float32
    )
    x = named(
        jnp.asarray(np.random.default_rng(2).normal(size=(2, 5, 4)), jnp.float32), ("batch", "pos", "embed")
    )
    first, second = layer(x)[0].array, jax.jit(lambda m, v: m(v)[0].array)(layer, x)
    # eager and jitted are separate programs: the router (embed 4, softmax 4), the experts (embed 4, mlp 6)
    # and the top-2 mix may add their terms in other orders
    atol = summation_tolerance(first, 4 + 4 + 4 + 6 + 2)
    np.testing.assert_allclose(first, second, atol=atol, rtol=0)
    np.testing.assert_array_equal(np.asarray(layer(x)[0].array), np.asarray(first))
    # a zero router makes all experts tie: the chosen ones must be 0 and 1
    zero = eqx.tree_at(lambda m: m.router.weight, layer, layer.router.weight * 0.0)
    _, chosen, weights = zero.route(x)
    assert np.asarray(chosen).tolist() == [[0, 1]] * 10
    np.testing.assert_array_equal(np.asarray(weights), 0.5)  # two equal numbers' shares: exactly halves


def test_training_loss_adds_the_weighted_router_losses() -> None:
    config = tiny(
        "mixtral", num_experts=4, num_experts_per_token=2, router_aux_loss_coef=0.1, router_z_loss_coef=0.01
    )
    model = init_model(config, jax.random.key(0))
    batch = LmBatch.from_tokens(random_tokens(2, 9).array)
    loss, metrics = jax.jit(lambda m, b: m.loss(b))(model, batch)
    expected = (
        metrics["cross_entropy"] + 0.1 * metrics["load_balancing_loss"] + 0.01 * metrics["router_z_loss"]
    )
    # two products and two additions of positive terms each side, in float32
    np.testing.assert_allclose(float(loss), float(expected), atol=summation_tolerance(expected, 4), rtol=0)
